"""Serving benchmark: Cosmos3 policy requests through SGLang and through the embedded diffusers backend.

One run, one model, the same payloads for both backends, so their numbers compare directly:

* **requests** — built by the project's ``Cosmos3ActionAdapter`` from synthetic LIBERO observations
  (two 256x256 uint8 views, a state vector the adapter does not send, one LIBERO prompt): policy
  mode, the 320x192 canvas, ``num_frames`` 17 (= action horizon 16 + 1, what ``build_payload``
  sends and what diffusers derives from ``chunk_size``), ``--inference-steps``, fixed seed,
  guidance 1.0. Batch ``b`` is ONE request carrying ``b`` observations with the same prompt, i.e.
  one token-length group, which SGLang serves as one batched forward (``--batching-max-size`` >= 16).
  Every request sent (warm-up or timed) has new random views: SGLang keeps a cross-request
  conditioning cache (``--conditioning-cache-max-size-mb``, on by default) that would skip the VAE
  for a repeated image; the prompt stays the same, as an env's prompt does during an eval, so the
  cache legitimately serves the text (UND) K/V after the first request of a batch size.
* **SGLang** — one ``sglang serve`` started by ``SGLangServerGroup`` on GPU 0 (DiT and VAE pinned
  on the GPU: ``--dit-cpu-offload false --vae-cpu-offload false``, since SGLang's own default for a
  TI2V pipeline would offload the DiT unless it guesses enough free memory), then per batch size
  ``--warmup`` requests and the median latency of ``--repeats`` requests sent one at a time
  (client-side: encoding, HTTP and decoding included). GPU memory: peak of ``nvidia-smi`` (the
  server's processes, and the whole device minus the baseline before launch), sampled every 0.5 s
  by a task in the requests' event loop. The group is closed and checked for leftover processes
  before the embedded phase, so the GPU is free for it.
* **embedded** — ``EmbeddedPolicyWorker``'s own load and ``generate`` code, run in this process
  on the chosen device instead of in a Ray actor, so ``FlopCounterMode`` and torch's memory
  statistics see it. It serves a batch image by image (the diffusers pipeline takes one
  observation per call), so it is warmed up once, not per batch size. Memory: torch's peak
  allocated/reserved per batch size and ``nvidia-smi`` after it.
* **FLOPs** — ``torch.utils.flop_counter.FlopCounterMode`` around the embedded pipeline: one
  request at 1 and 2 denoising steps gives the per-step and the fixed part (VAE encoding of the
  conditioning video), a count at all ``--inference-steps`` checks that ``F(N) = F(1) + (N-1)
  (F(2) - F(1))``, and the ``--flops-batch`` request (1 and 2 steps) checks that a batch costs
  ``b`` times one observation (the pipeline runs image by image). Attention is counted with a
  GQA-aware formula (torch's own rejects fewer KV heads than query heads; like torch, no discount
  for the causal text pathway).
  The same count does NOT fit SGLang, which does less for the same request, in three places read
  from its code (sglang 0.5.23: ``Cosmos3DenoisingStage``, ``Cosmos3LatentPreparationStage``,
  ``Cosmos3LanguageModel.forward`` under ``cached_conditioning``): Cosmos3 is a two-pathway
  transformer, and diffusers runs the text (UND) pathway at every step while SGLang runs it at
  most once per request, caching its K/V — across requests too, so with an unchanged prompt not at
  all; and diffusers VAE-encodes a 17-frame video made of the conditioning image, SGLang the image
  alone (one frame). So SGLang's work in the timed requests is ``fixed - VAE(17 frames) +
  VAE(1 frame) + N x GEN`` (``+ UND`` when the text is new): the UND share of a step is split off
  the counted step by module name (its attention by the token counts read off the projections),
  the two VAE encodings are counted on the pipeline's VAE. Both works are reported; SGLang's
  TFLOP/s use its own, the JSON also holds them at diffusers' count. A SGLang batch costs ``b``
  times one observation too (equal token lengths: no padding).
* **matmul rate** — an ``N^3`` bf16 matmul (8192 on a GPU, 1024 on CPU), median of 10 after 3
  warm-ups; TFLOP/s of a backend / this rate = the fraction in the table.

``--time-budget-s`` bounds the whole run: SGLang gets ``--sglang-share`` of the time left when its
phase starts (start-up included), the embedded phase the rest; a batch size whose predicted time
(last median scaled linearly with the batch, times the calls) does not fit its phase is skipped,
with the larger ones after it. The JSON is rewritten after every step, so a run killed from outside
still leaves what it measured; the short table is printed last.

    # CPU smoke run (tiny random model, local .venv-sglang server), a few minutes on 2 cores:
    .venv/bin/python benchmarks/gpu/serve_actions.py --device cpu --preset tiny --work-dir /tmp/serve_tiny \\
        --batch-sizes 1,2 --inference-steps 2 --repeats 1
    # one H200 (~8 min): random Nano weights written to /tmp (33 GB), SGLang, then embedded:
    python benchmarks/gpu/serve_actions.py --preset nano --work-dir /tmp/serve_nano --inference-steps 30 \\
        --repeats 3 --embedded-repeats 1 --time-budget-s 450 --log-dir $OUT/logs --out $OUT/serve_actions.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import logging
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import psutil
import torch

from rlinf_cosmos3.config.libero_suites import ACTION_DIM, STATE_DIM
from rlinf_cosmos3.config.rollout import RolloutModelConfig, SGLangConfig
from rlinf_cosmos3.models.cosmos3.domains import ACTION_HORIZON
from rlinf_cosmos3.models.cosmos3.tiny import (
    count_parameters,
    get_preset,
    random_transformer,
    random_vae,
    write_model_dir,
    write_random_weights,
    write_synthetic_action_stats,
)
from rlinf_cosmos3.tracking.flops import attention_flop_formulas, measure_matmul
from rlinf_cosmos3.validation.rollout import validate_rollout_model
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter, RequestGroup
from rlinf_cosmos3.workers.rollout.embedded import EmbeddedPolicyWorker
from rlinf_cosmos3.workers.rollout.server_process import tagged_processes
from rlinf_cosmos3.workers.rollout.sglang_group import SGLangServerGroup

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the scripts' shared _common
from _common import (  # noqa: E402
    Budget,
    device_memory_gib,
    device_name,
    device_slug,
    host_info,
    results_path,
    write_json,
)

logger = logging.getLogger("benchmarks.serve_actions")

VIEW_SIZE = 256
PROMPT = "pick up the black bowl between the plate and the ramekin and place it on the plate"
"""libero_spatial task 0 (LIBERO's ``task.language``)."""
SGLANG_ARGS = "--dit-cpu-offload false --vae-cpu-offload false"
MEMORY_POLL_S = 0.5
MIN_PHASE_S = 30.0
"""A backend phase with less time than this left is skipped rather than started."""
GIB = 1024.0
"""MiB per GiB (nvidia-smi reports MiB)."""

_LAYER = r"\.layers\.\d+\."
UND_LEAF = re.compile(_LAYER + r"(self_attn\.(to_q|to_k|to_v|to_out)|mlp\.\w+)$")
GEN_LEAF = re.compile(_LAYER + r"(self_attn\.(add_q_proj|add_k_proj|add_v_proj|to_add_out)|mlp_moe_gen\.\w+)$")
SELF_ATTN = re.compile(_LAYER[:-2] + r"\.self_attn$")


# ---------------------------------------------------------------------------------------------- setup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-path", type=Path, help="an existing diffusers Cosmos3 directory")
    model.add_argument("--preset", choices=("tiny", "nano"),
                       help="write a random model of this preset into --work-dir (nano: weights made on the GPU)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="model, stats and server logs (default: a temp dir; required with --preset nano)")
    p.add_argument("--overwrite", action="store_true", help="rewrite the preset model even if it exists")
    p.add_argument("--stats-path", type=Path, default=None,
                   help="action stats JSON (default: synthetic stats; a random model's actions mean nothing)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="sglang,embedded",
                   help="comma-separated, run in this order (FLOPs are counted in the embedded phase)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16", help="observations per request")
    p.add_argument("--inference-steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=42, help="request seed (and the random weights' seed)")
    p.add_argument("--repeats", type=int, default=3, help="timed requests per batch size (median)")
    p.add_argument("--embedded-repeats", type=int, default=None, help="default: --repeats")
    p.add_argument("--warmup", type=int, default=1, help="untimed SGLang requests per batch size")
    p.add_argument("--flops-batch", type=int, default=None,
                   help="batch whose FLOPs are counted next to batch 1 (default: 8, or the largest batch if smaller)")
    p.add_argument("--no-flops", dest="flops", action="store_false", help="skip the FLOP count")
    p.add_argument("--matmul-size", type=int, default=None, help="default: 8192 on a GPU, 1024 on CPU")
    p.add_argument("--time-budget-s", type=float, default=None, help="wall-clock budget of the whole run")
    p.add_argument("--sglang-share", type=float, default=0.5,
                   help="share of the time left at its start that the SGLang phase may use")
    p.add_argument("--sglang-args", default=SGLANG_ARGS, help="extra `sglang serve` arguments")
    p.add_argument("--base-port", type=int, default=30000)
    p.add_argument("--health-timeout-s", type=float, default=600.0)
    p.add_argument("--http-timeout-s", type=float, default=600.0)
    p.add_argument("--log-dir", type=Path, default=None, help="server logs (default: <work-dir>/logs)")
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: benchmarks/results/serve_actions_<device>_<date>.json)")
    args = p.parse_args(argv)
    args.batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",") if b.strip()})
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.embedded_repeats is None:
        args.embedded_repeats = args.repeats
    if args.flops_batch is None:
        args.flops_batch = min(8, args.batch_sizes[-1]) if args.batch_sizes else 8
    # SGLang's --batching-max-size and the adapter's split size: every benchmark request stays one group.
    args.max_batch = max(16, args.flops_batch, *args.batch_sizes) if args.batch_sizes else 16
    if args.matmul_size is None:
        args.matmul_size = 8192 if args.device == "cuda" else 1024
    if unknown := set(args.backends) - {"sglang", "embedded"}:
        p.error(f"unknown backends {sorted(unknown)}; use sglang and/or embedded")
    if not args.batch_sizes or args.batch_sizes[0] < 1 or args.repeats < 1 or args.embedded_repeats < 1:
        p.error("batch sizes and repeats must be >= 1")
    if args.preset == "nano" and args.device != "cuda":
        p.error("--preset nano makes its 15B random weights on a GPU: use --device cuda")
    if args.preset == "nano" and args.work_dir is None:
        p.error("--preset nano writes ~34 GB: give --work-dir on a disk with room (not under $OUT)")
    if not 0 < args.sglang_share <= 1:
        p.error("--sglang-share must be in (0, 1]")
    return args


class Report:
    """The results JSON, rewritten atomically after every step so a killed run keeps what it measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}

    def save(self) -> None:
        write_json(self.path, self.data)


def machine(device: str) -> dict[str, Any]:
    import diffusers

    info: dict[str, Any] = {**host_info(), "torch": torch.__version__, "diffusers": diffusers.__version__,
                            "device": device}
    if device == "cuda":
        gpu = torch.device("cuda", 0)
        info.update(gpu=device_name(gpu), gpu_memory_gib=round(device_memory_gib(gpu), 1), gpu_index=physical_gpu())
    return info


def sglang_version(python: Path) -> str | None:
    """sglang's version in the server environment (its pins differ from ours)."""
    cmd = [str(python), "-c", "import importlib.metadata as m; print(m.version('sglang'))"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------------------------- model


def expected_weight_bytes(preset: str) -> int:
    """Bytes ``write_random_weights`` saves: bf16 transformer, fp32 VAE (counted on the meta device)."""
    spec = get_preset(preset)
    transformer = count_parameters(random_transformer(spec.transformer, device="meta"))
    vae = count_parameters(random_vae(spec.vae, device="meta"))
    return 2 * transformer + 4 * vae


def prepare_model(args: argparse.Namespace, work_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The model directory: given, reused, or written with the project's tiny.py (staged, then renamed,
    so a directory under the final name is always complete)."""
    if args.model_path is not None:
        return args.model_path.resolve(), {"source": "given"}
    target = work_dir / f"cosmos3_{args.preset}"
    if (target / "model_index.json").is_file() and not args.overwrite:
        logger.info("reusing the %s model at %s (--overwrite rewrites it)", args.preset, target)
        return target, {"source": "reused", "preset": args.preset}
    spec = get_preset(args.preset)
    info: dict[str, Any] = {"source": "written", "preset": args.preset, "seed": args.seed}
    if not spec.write_weights:
        need = expected_weight_bytes(args.preset)
        free = shutil.disk_usage(work_dir).free
        info.update(weight_bytes=need, disk_free_bytes=free)
        if free < need * 1.1:
            raise RuntimeError(f"{work_dir} has {free / 1e9:.1f} GB free; the {args.preset} weights need "
                               f"{need / 1e9:.1f} GB (+10%)")
        logger.info("writing random %s weights (%.1f GB) to %s; %.1f GB free there", args.preset, need / 1e9,
                    target, free / 1e9)
    stage = work_dir / f".{target.name}.staging"
    shutil.rmtree(stage, ignore_errors=True)  # a previous run killed while writing
    start = time.monotonic()
    try:
        write_model_dir(stage, preset=args.preset, seed=args.seed)
        if not spec.write_weights:
            write_random_weights(stage, device=args.device, seed=args.seed)
        if target.exists():
            if not (target / "model_index.json").is_file():
                raise FileExistsError(f"{target} exists and is not a model directory; refusing to replace it")
            shutil.rmtree(target)
        stage.rename(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        release_gpu()  # the materialised weights stay cached otherwise; the server needs the memory
    info["write_s"] = round(time.monotonic() - start, 1)
    logger.info("model written in %.1f s: %s", info["write_s"], target)
    return target, info


def release_gpu() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- requests


@dataclass
class Request:
    """One benchmark request: ``batch`` observations with the same prompt, one token-length group."""

    batch: int
    group: RequestGroup
    payload: dict[str, Any]


def synthetic_observations(batch: int, seed: int) -> dict[str, Any]:
    """RLinf-style env observations: upright views, a state (not sent by the adapter), one prompt."""
    rng = np.random.default_rng(seed)
    shape = (batch, VIEW_SIZE, VIEW_SIZE, 3)
    return {"main_images": rng.integers(0, 256, shape, dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, shape, dtype=np.uint8),
            "states": rng.normal(size=(batch, STATE_DIM)).astype(np.float32),
            "task_descriptions": [PROMPT] * batch}


def build_requests(adapter: Cosmos3ActionAdapter, batches: list[int], count: int,
                   seed: int) -> dict[int, list[Request]]:
    """``count`` requests per batch size, each with new views (so no server cache serves their images)."""
    requests: dict[int, list[Request]] = {}
    for batch in sorted(set(batches)):
        for i in range(count):
            groups = adapter.request_groups(synthetic_observations(batch, seed + 1000 * batch + i))
            if len(groups) != 1 or len(groups[0]) != batch:
                raise RuntimeError(f"batch {batch} became groups of {[len(g) for g in groups]}, not one request")
            requests.setdefault(batch, []).append(Request(batch, groups[0], adapter.build_request(groups[0])))
    return requests


def with_steps(payload: Mapping[str, Any], steps: int) -> dict[str, Any]:
    return {**payload, "parameters": {**payload["parameters"], "num_inference_steps": steps}}


def check_actions(adapter: Cosmos3ActionAdapter, request: Request, output: np.ndarray) -> str:
    """``ok`` when the model output turns into ``[b, 16, 7]`` finite LIBERO commands, else why not."""
    try:
        actions = adapter.parse_response(output, request.group)
    except ValueError as err:
        return f"error: {err}"
    return "ok" if actions.shape == (request.batch, ACTION_HORIZON, ACTION_DIM) else f"error: shape {actions.shape}"


# ---------------------------------------------------------------------------------------------- measuring


def physical_gpu() -> str:
    """nvidia-smi's id of our GPU 0 (the first entry of CUDA_VISIBLE_DEVICES, if set)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def _nvidia_smi(gpu: str, query: str) -> list[str]:
    return ["nvidia-smi", "-i", gpu, query, "--format=csv,noheader,nounits"]


GPU_QUERIES = ("--query-gpu=memory.used", "--query-compute-apps=pid,used_memory")


def _parse_gpu_memory(used: str, apps: str) -> tuple[float, dict[int, float]]:
    per_pid = {}
    for line in apps.splitlines():
        pid, _, mib = (part.strip() for part in line.partition(","))
        if pid.isdigit() and mib.replace(".", "", 1).isdigit():
            per_pid[int(pid)] = float(mib)
    return float(used.split()[0]), per_pid


def gpu_memory_mib(gpu: str) -> tuple[float, dict[int, float]] | None:
    """Used MiB of the whole GPU and per compute process (pids as nvidia-smi sees them); None without it."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        used, apps = (subprocess.run(_nvidia_smi(gpu, query), capture_output=True, text=True, timeout=10,
                                     check=True).stdout for query in GPU_QUERIES)
    except (OSError, subprocess.SubprocessError):
        return None
    return _parse_gpu_memory(used, apps)


async def gpu_memory_mib_async(gpu: str) -> tuple[float, dict[int, float]] | None:
    """:func:`gpu_memory_mib` without blocking the event loop that is waiting for a response."""
    if shutil.which("nvidia-smi") is None:
        return None
    texts = []
    for query in GPU_QUERIES:
        proc = await asyncio.create_subprocess_exec(*_nvidia_smi(gpu, query), stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL)
        try:
            stdout, _ = await asyncio.wait_for(proc.communicate(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return None
        if proc.returncode != 0:
            return None
        texts.append(stdout.decode())
    return _parse_gpu_memory(*texts)


class PeakMemory:
    """Peak memory of the server's processes while requests run: the whole GPU and their share of it
    (nvidia-smi) and their host RSS, sampled by a task in the requests' own event loop. Sampling, not
    allocator stats, because the server is another process (and it empties its cache when idle);
    a task, not a thread, so nothing runs beside the driver's own code."""

    def __init__(self, gpu: str | None, pids: set[int], interval_s: float = MEMORY_POLL_S) -> None:
        self.gpu, self.pids, self.interval_s = gpu, set(pids), interval_s
        self.device_mib: float | None = None
        self.process_mib: float | None = None
        self.host_rss_mib = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        reading = await gpu_memory_mib_async(self.gpu) if self.gpu is not None else None
        if reading is not None:
            device, per_pid = reading
            self.device_mib = max(self.device_mib or 0.0, device)
            mine = [per_pid[pid] for pid in self.pids if pid in per_pid]
            if mine:
                self.process_mib = max(self.process_mib or 0.0, sum(mine))
        rss = 0
        for pid in self.pids:
            try:
                rss += psutil.Process(pid).memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.host_rss_mib = max(self.host_rss_mib, rss / 2**20)

    async def _run(self) -> None:
        while not self._stop.is_set():
            await self._sample()
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            except TimeoutError:
                continue

    async def __aenter__(self) -> PeakMemory:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        await self._sample()

    def summary(self, baseline_mib: float | None) -> dict[str, Any]:
        delta = None if self.device_mib is None or baseline_mib is None else self.device_mib - baseline_mib
        table_mib = self.process_mib if self.process_mib is not None else delta
        return {"gpu_device_used_mib_peak": self.device_mib, "gpu_device_minus_baseline_mib_peak": delta,
                "gpu_process_mib_peak": self.process_mib, "host_rss_mib_peak": round(self.host_rss_mib, 1),
                "table_mib": table_mib if table_mib is not None else round(self.host_rss_mib, 1)}


def embedded_memory(gpu: str | None, baseline_mib: float | None) -> dict[str, Any]:
    """This process's memory after a batch: torch's peaks (since the last reset), nvidia-smi now (the
    allocator keeps its cache, so that is the peak reserved plus the context), peak host RSS."""
    reading = gpu_memory_mib(gpu) if gpu is not None else None
    delta = None if reading is None or baseline_mib is None else reading[0] - baseline_mib
    summary: dict[str, Any] = {"gpu_device_used_mib": reading[0] if reading else None,
                               "gpu_device_minus_baseline_mib": delta,
                               "host_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        summary.update(torch_max_allocated_mib=torch.cuda.max_memory_allocated() / 2**20,
                       torch_max_reserved_mib=torch.cuda.max_memory_reserved() / 2**20)
    summary["table_mib"] = delta if delta is not None else summary["host_maxrss_mib"]
    return summary


async def time_requests(call: Callable[[Request], Awaitable[np.ndarray]], requests: list[Request], warmup: int,
                        repeats: int) -> tuple[list[float], list[float], np.ndarray]:
    """Warm-up and timed latencies, one request after another (``call`` returns host arrays, so the
    device has finished)."""
    warm: list[float] = []
    timed: list[float] = []
    out: np.ndarray | None = None
    for i, request in enumerate(requests[:warmup + repeats]):
        start = time.perf_counter()
        out = await call(request)
        (warm if i < warmup else timed).append(time.perf_counter() - start)
    assert out is not None
    return warm, timed, out


def time_calls(call: Callable[[Request], np.ndarray], requests: list[Request], warmup: int,
               repeats: int) -> tuple[list[float], list[float], np.ndarray]:
    """:func:`time_requests` for a plain function (the embedded pipeline)."""
    async def call_async(request: Request) -> np.ndarray:
        return call(request)

    return asyncio.run(time_requests(call_async, requests, warmup, repeats))


def predicted_s(rows: list[dict[str, Any]], batch: int, calls: int) -> float:
    """Time of ``calls`` requests of ``batch``, scaled linearly from the last measured batch (exact for
    the embedded backend, which serves image by image; an upper bound for SGLang)."""
    if not rows:
        return 0.0
    last = rows[-1]
    return last["median_s"] * batch / last["batch"] * calls


def fits(rows: list[dict[str, Any]], batch: int, calls: int, deadline: float) -> tuple[bool, str]:
    need, left = predicted_s(rows, batch, calls), deadline - time.monotonic()
    if left <= 0 or need > left:
        return False, f"time budget: predicted {need:.0f} s, {max(left, 0.0):.0f} s left in the phase"
    return True, ""


def batch_row(batch: int, warm: list[float], timed: list[float], memory: dict[str, Any],
              actions: str) -> dict[str, Any]:
    median = statistics.median(timed)
    return {"batch": batch, "median_s": median, "latencies_s": timed, "warmup_latencies_s": warm,
            "actions_per_s": batch * ACTION_HORIZON / median, "decisions_per_s": batch / median,
            "memory": memory, "actions": actions}


def log_row(backend: str, row: dict[str, Any]) -> None:
    logger.info("%s batch %d: median %.3f s over %d (%s), %.1f actions/s, %.2f decisions/s, actions %s",
                backend, row["batch"], row["median_s"], len(row["latencies_s"]),
                ", ".join(f"{t:.3f}" for t in row["latencies_s"]), row["actions_per_s"], row["decisions_per_s"],
                row["actions"])


# ---------------------------------------------------------------------------------------------- FLOPs


def count_flops(call: Callable[[], Any]) -> dict[str, int]:
    """FLOPs of ``call`` per module (``Global`` = all), as counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, depth=None, custom_mapping=attention_flop_formulas()) \
            as counter:
        call()
    return {module: int(sum(ops.values())) for module, ops in counter.get_flop_counts().items()}


def _own(counts: Mapping[str, int], module: str) -> int:
    """FLOPs of ``module``'s own ops (its total minus its direct children's): here, the attention."""
    prefix = module + "."
    children = sum(v for k, v in counts.items() if k.startswith(prefix) and "." not in k[len(prefix):])
    return counts[module] - children


def split_flops(one: Mapping[str, int], two: Mapping[str, int], steps: int, config: Mapping[str, Any]) -> dict:
    """Fixed part, per-step part and its text (UND) share, from counts at 1 and 2 denoising steps."""
    step = {m: two.get(m, 0) - one.get(m, 0) for m in set(one) | set(two)}
    per_step, fixed = step["Global"], one["Global"] - step["Global"]
    und_linear = sum(v for m, v in step.items() if UND_LEAF.search(m))
    gen_linear = sum(v for m, v in step.items() if GEN_LEAF.search(m))
    attention = sum(_own(step, m) for m in step if SELF_ATTN.search(m))
    # Token counts from the query projections: 2 * tokens * hidden * (heads * head_dim) per layer.
    layers, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
    heads, head_dim = int(config["num_attention_heads"]), int(config["head_dim"])
    per_token = 2 * layers * hidden * heads * head_dim
    s_und = sum(v for m, v in step.items() if m.endswith(".self_attn.to_q")) / per_token
    s_gen = sum(v for m, v in step.items() if m.endswith(".self_attn.add_q_proj")) / per_token
    attn_und = 4 * layers * heads * head_dim * s_und * s_und
    attn_gen = 4 * layers * heads * head_dim * s_gen * (s_und + s_gen)
    counted = attention > 0
    if not counted:  # an attention kernel the counter has no formula for: add the model's own numbers
        attention = int(attn_und + attn_gen)
        per_step += attention
    und = und_linear + (attention * attn_und / (attn_und + attn_gen) if attn_und + attn_gen else 0.0)
    fixed_by_module = {m: one.get(m, 0) - step.get(m, 0) for m in one if "." not in m and m != "Global"}
    return {
        "fixed": fixed, "per_step": per_step, "per_step_und": und, "per_step_gen": per_step - und,
        "per_step_linear_und": und_linear, "per_step_linear_gen": gen_linear, "per_step_attention": attention,
        "attention_counted": counted,
        "attention_vs_token_model": attention / (attn_und + attn_gen) if attn_und + attn_gen else None,
        "tokens": {"und": round(s_und, 2), "gen": round(s_gen, 2)},
        "fixed_by_module": {m: v for m, v in fixed_by_module.items() if v},
        "diffusers_request": fixed + steps * per_step,
    }


def vae_encode_flops(worker: EmbeddedPolicyWorker, frames: int, height: int, width: int) -> int:
    """FLOPs of the pipeline's VAE encoding ``frames`` frames of the canvas."""
    vae = worker.pipe.vae
    weight = next(vae.parameters())
    pixels = torch.zeros(1, 3, frames, height, width, dtype=weight.dtype, device=weight.device)
    with torch.inference_mode():
        return count_flops(partial(vae.encode, pixels))["Global"]


def count_request_flops(worker: EmbeddedPolicyWorker, single: Request, batched: Request, steps: int) -> dict:
    """Diffusers' work per observation (counted) and SGLang's (the same parts, recombined); see the
    module docstring."""
    def counts(request: Request, n: int) -> dict[str, int]:
        start = time.monotonic()
        result = count_flops(partial(worker.generate, with_steps(request.payload, n)))
        logger.info("FLOPs of batch %d at %d step(s): %.4g (counted in %.1f s)", request.batch, n,
                    result["Global"], time.monotonic() - start)
        return result

    one, two = counts(single, 1), counts(single, 2)
    counted_step = two["Global"] - one["Global"]
    flops = split_flops(one, two, steps, dict(worker.pipe.transformer.config))
    full = {1: one, 2: two}[steps]["Global"] if steps <= 2 else counts(single, steps)["Global"]
    flops["counted_all_steps"] = full
    flops["extrapolation_matches_count"] = full == one["Global"] + (steps - 1) * counted_step
    # SGLang encodes the conditioning image as one frame; diffusers encodes a 17-frame video of it.
    params = single.payload["parameters"]
    canvas = int(params["height"]), int(params["width"])
    flops["vae_encode_video"] = vae_encode_flops(worker, int(params["num_frames"]), *canvas)
    flops["vae_encode_image"] = vae_encode_flops(worker, 1, *canvas)
    flops["sglang_fixed"] = flops["fixed"] - flops["vae_encode_video"] + flops["vae_encode_image"]
    # Timed requests repeat a prompt the server has cached (UND K/V); a new prompt adds one UND pass.
    flops["sglang_request"] = flops["sglang_fixed"] + steps * flops["per_step_gen"]
    flops["sglang_request_new_prompt"] = flops["sglang_request"] + flops["per_step_und"]
    if batched.batch != single.batch:
        b_one, b_two = counts(batched, 1)["Global"], counts(batched, 2)["Global"]
        b_step = b_two - b_one
        flops["batch_check"] = {"batch": batched.batch,
                                "per_step_ratio_to_batch_1": b_step / (batched.batch * counted_step),
                                "fixed_ratio_to_batch_1": (b_one - b_step) / (batched.batch * flops["fixed"])}
    flops["steps"] = steps
    return flops


# ---------------------------------------------------------------------------------------------- backends


@dataclass
class Context:
    """What both backend phases share."""

    args: argparse.Namespace
    model_cfg: RolloutModelConfig
    adapter: Cosmos3ActionAdapter
    requests: dict[int, list[Request]]
    budget: Budget
    report: Report
    log_dir: Path
    gpu: str | None
    phases: list[str] = field(default_factory=list)


def server_pids(group: SGLangServerGroup) -> set[int]:
    """The group's server processes and everything they forked (scheduler, workers)."""
    pids: set[int] = set()
    for server in group.servers:
        if server.pid is None:
            continue
        try:
            leader = psutil.Process(server.pid)
            pids.add(leader.pid)
            pids.update(child.pid for child in leader.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return pids


def stop_leftovers(tag: str, wait_s: float = 10.0) -> list[int]:
    """Wait for the group's processes to go; kill (by pid) and return any that stay."""
    deadline = time.monotonic() + wait_s
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in left:
        logger.error("sglang process %d (%s) outlived the group's close(); killing it", proc.pid, proc.name())
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    return [proc.pid for proc in left]


SERVER_ARG_KEYS = re.compile(r"offload|resident|attention_backend$|torch_compile|cuda_graph|batching|"
                             r"performance_mode|conditioning_cache|precision|num_gpus|warmup_mode")
SERVER_NOTES = re.compile(r"offload|resident|attention backend|Batch admission|Prepared latents with shape|"
                          r"Prepared \d+ timesteps|Starting denoising|out of memory", re.IGNORECASE)


def server_log_notes(log_path: Path | None, limit: int = 40) -> dict[str, Any]:
    """What the server log says about placement and work: its resolved arguments (offload, attention,
    batching, caches) and distinct lines on latent shapes (batching), steps and memory."""
    if log_path is None or not log_path.is_file():
        return {}
    args: dict[str, Any] = {}
    notes: list[str] = []
    for line in log_path.read_text(errors="replace").splitlines():
        message = re.sub(r"^\[[^]]*\] ", "", line.strip())
        if message.startswith("server_args: {"):
            try:
                parsed = json.loads(message[len("server_args: "):])
            except json.JSONDecodeError:
                continue
            args = {k: v for k, v in parsed.items() if SERVER_ARG_KEYS.search(k)}
        elif SERVER_NOTES.search(message) and message[:300] not in notes and len(notes) < limit:
            notes.append(message[:300])
    return {"server_args": args, "notes": notes}


def start_phase(ctx: Context, backend: str) -> tuple[dict[str, Any], float | None]:
    """The phase's result record and deadline (``--sglang-share`` of the time left, all of it for the last
    phase); no deadline when too little time is left to start it."""
    result: dict[str, Any] = {"status": "running", "batches": [], "skipped": []}
    ctx.report.data[backend] = result
    last = ctx.phases.index(backend) == len(ctx.phases) - 1
    deadline = ctx.budget.phase_end(1.0 if last else ctx.args.sglang_share)
    if deadline - time.monotonic() < MIN_PHASE_S:
        result.update(status="skipped", error=f"time budget: {max(0.0, deadline - time.monotonic()):.0f} s left")
        logger.warning("%s phase skipped: %s", backend, result["error"])
        ctx.report.save()
        return result, None
    return result, deadline


Served = tuple[list[float], list[float], np.ndarray, dict[str, Any]]
"""One batch size served: warm-up and timed latencies, the last output, the memory summary."""


def measure_batches(ctx: Context, backend: str, result: dict[str, Any], calls: int, deadline: float,
                    serve: Callable[[list[Request]], Served]) -> None:
    """Every batch size in turn while its predicted time (``calls`` requests) fits the phase: a row in
    ``result["batches"]``, the JSON saved after each; the first that does not fit is skipped with all
    larger ones."""
    for batch in ctx.args.batch_sizes:
        ok, why = fits(result["batches"], batch, calls, deadline)
        if not ok:
            skipped = [b for b in ctx.args.batch_sizes if b >= batch]
            logger.warning("%s: skipping batch sizes %s (%s)", backend, skipped, why)
            result["skipped"] = [{"batch": b, "reason": why} for b in skipped]
            return
        requests = ctx.requests[batch]
        warm, timed, out, memory = serve(requests)
        row = batch_row(batch, warm, timed, memory, check_actions(ctx.adapter, requests[0], out))
        result["batches"].append(row)
        log_row(backend, row)
        ctx.report.save()


async def serve_batch(group: SGLangServerGroup, requests: list[Request], warmup: int, repeats: int,
                      memory: PeakMemory) -> tuple[list[float], list[float], np.ndarray]:
    """One batch size's requests through the group, memory sampled meanwhile."""
    async def call(request: Request) -> np.ndarray:
        return (await group.generate([request.payload]))[0]

    async with memory:
        return await time_requests(call, requests, warmup, repeats)


def run_sglang(ctx: Context) -> dict[str, Any]:
    """Start one server, measure every batch size that fits, stop it and check nothing is left."""
    args = ctx.args
    result, deadline = start_phase(ctx, "sglang")
    if deadline is None:
        return result
    cfg = SGLangConfig(
        num_servers=1, gpus_per_server=1 if args.device == "cuda" else 0, base_port=args.base_port,
        batching_max_size=args.max_batch, max_inflight_per_server=1,
        health_timeout_s=max(MIN_PHASE_S, min(args.health_timeout_s, deadline - time.monotonic())),
        http_timeout_s=max(MIN_PHASE_S, min(args.http_timeout_s, deadline - time.monotonic())),
        http_max_retries=0, max_restarts=0,
        extra_server_args=shlex.split(args.sglang_args),
    )
    result["config"] = {k: v for k, v in asdict(cfg).items() if k != "python"}
    result["sglang_version"] = sglang_version(cfg.interpreter)
    baseline = gpu_memory_mib(ctx.gpu) if ctx.gpu else None
    result["gpu_used_mib_before_launch"] = baseline[0] if baseline else None
    group: SGLangServerGroup | None = None
    try:
        with asyncio.Runner() as runner:
            group = SGLangServerGroup(ctx.model_cfg, cfg, log_dir=ctx.log_dir)
            start = time.monotonic()
            runner.run(group.astart())
            result["startup_s"] = round(time.monotonic() - start, 1)
            result["url"] = group.urls[0]
            logger.info("sglang server up in %.1f s at %s", result["startup_s"], group.urls[0])
            ctx.report.save()
            pids = server_pids(group)

            def serve(requests: list[Request]) -> Served:
                memory = PeakMemory(ctx.gpu, pids)
                warm, timed, out = runner.run(serve_batch(group, requests, args.warmup, args.repeats, memory))
                return warm, timed, out, memory.summary(result["gpu_used_mib_before_launch"])

            measure_batches(ctx, "sglang", result, args.warmup + args.repeats, deadline, serve)
        result["status"] = "ok"
    except Exception as err:
        logger.exception("sglang phase failed")
        result.update(status="error", error=f"{type(err).__name__}: {err}"[-6000:])
    finally:
        if group is not None:
            group.close()
            result["leftover_pids_killed"] = stop_leftovers(group.tag)
        logs = sorted((ctx.log_dir / "sglang").glob("*.log"), key=lambda path: path.stat().st_mtime)
        log_path = logs[-1] if logs else None
        result["server_log"] = log_path
        result.update(server_log_notes(log_path))
        after = gpu_memory_mib(ctx.gpu) if ctx.gpu else None
        result["gpu_used_mib_after_stop"] = after[0] if after else None
        ctx.report.save()
    return result


def _generate(worker: EmbeddedPolicyWorker, request: Request) -> np.ndarray:
    return worker.generate(request.payload)


class LocalEmbeddedWorker(EmbeddedPolicyWorker):
    """``EmbeddedPolicyWorker``'s own loading and ``generate``, in this process on a chosen device (no
    Ray actor), so FlopCounterMode and torch's memory statistics see the pipeline."""

    def __init__(self, model_path: str, precision: str, device: torch.device) -> None:
        self._local_device = device
        super().__init__(model_path, precision)

    @property
    def device(self) -> torch.device:
        return self._local_device


def run_embedded(ctx: Context) -> dict[str, Any]:
    """Load the pipeline, count FLOPs, warm up once, then measure every batch size that fits."""
    args = ctx.args
    result, deadline = start_phase(ctx, "embedded")
    if deadline is None:
        return result
    cuda = args.device == "cuda"
    baseline = gpu_memory_mib(ctx.gpu) if ctx.gpu else None
    result["gpu_used_mib_before_load"] = baseline[0] if baseline else None
    worker: LocalEmbeddedWorker | None = None
    try:
        start = time.monotonic()
        worker = LocalEmbeddedWorker(str(ctx.model_cfg.model_path), ctx.model_cfg.precision,
                                     torch.device(args.device))
        result["load_s"] = round(time.monotonic() - start, 1)
        result["load_memory"] = embedded_memory(ctx.gpu, result["gpu_used_mib_before_load"])
        if cuda:
            result["load_memory"]["torch_allocated_mib"] = torch.cuda.memory_allocated() / 2**20
        logger.info("embedded pipeline loaded in %.1f s on %s", result["load_s"], args.device)
        ctx.report.save()
        if args.flops:
            single, batched = ctx.requests[1][0], ctx.requests[args.flops_batch][0]
            result["flops"] = count_request_flops(worker, single, batched, args.inference_steps)
            ctx.report.save()
        generate = partial(_generate, worker)
        result["warmup_s"], _, _ = time_calls(generate, ctx.requests[args.batch_sizes[0]], 1, 0)

        def serve(requests: list[Request]) -> Served:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            warm, timed, out = time_calls(generate, requests, 0, args.embedded_repeats)
            return warm, timed, out, embedded_memory(ctx.gpu, result["gpu_used_mib_before_load"])

        measure_batches(ctx, "embedded", result, args.embedded_repeats, deadline, serve)
        result["status"] = "ok"
    except Exception as err:
        logger.exception("embedded phase failed")
        result.update(status="error", error=f"{type(err).__name__}: {err}"[-6000:])
    finally:
        del worker
        release_gpu()
        ctx.report.save()
    return result


# ---------------------------------------------------------------------------------------------- summary


def finalize(data: dict[str, Any], headline_batch: int = 8) -> None:
    """FLOP rates per row and the headline ratios, from what was measured."""
    flops = data.get("embedded", {}).get("flops")
    rate = data["matmul"]["tflops"]
    per_image = {"sglang": flops["sglang_request"], "embedded": flops["diffusers_request"]} if flops else {}
    headline: dict[str, Any] = {"batching_gain": {}, "sglang_vs_embedded": {}}
    by_backend: dict[str, dict[int, float]] = {}
    for backend in ("sglang", "embedded"):
        rows = data.get(backend, {}).get("batches", [])
        for row in rows:
            if backend in per_image:
                row["flops_per_request"] = per_image[backend] * row["batch"]
                row["tflops"] = row["flops_per_request"] / row["median_s"] / 1e12
                row["fraction_of_matmul"] = row["tflops"] / rate
            if backend == "sglang" and flops:
                row["tflops_at_diffusers_count"] = flops["diffusers_request"] * row["batch"] / row["median_s"] / 1e12
        by_backend[backend] = {row["batch"]: row["actions_per_s"] for row in rows}
        measured = by_backend[backend]
        if 1 in measured and headline_batch in measured:
            headline["batching_gain"][backend] = {f"b{headline_batch}_vs_b1": measured[headline_batch] / measured[1]}
    for batch, sglang_rate in by_backend.get("sglang", {}).items():
        if batch in by_backend.get("embedded", {}):
            headline["sglang_vs_embedded"][batch] = sglang_rate / by_backend["embedded"][batch]
    data["headline"] = headline


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(data: dict[str, Any]) -> str:
    """The short summary printed last (the remote call returns only the output's tail)."""
    req, mm, meta = data["request"], data["matmul"], data["machine"]
    where = meta.get("gpu", "CPU")
    lines = [f"serve_actions: {data['model']['name']}, policy {req['width']}x{req['height']}, {req['num_frames']} "
             f"frames, {ACTION_HORIZON} actions, {req['num_inference_steps']} steps, seed {req['seed']}, "
             f"prompt {req['prompt_tokens']} tokens | {where} | bf16 matmul {mm['size']}^3: {mm['tflops']:.1f} TFLOP/s",
             f"{'backend':<9}{'batch':>6}{'latency s':>11}{'actions/s':>11}{'decisions/s':>13}{'TFLOP/s':>9}"
             f"{'of mm':>7}{'mem GiB':>9}  actions"]
    for backend in ("sglang", "embedded"):
        phase = data.get(backend)
        if phase is None:
            continue
        for row in phase["batches"]:
            gib = row["memory"]["table_mib"] / GIB
            frac = row.get("fraction_of_matmul")
            pct = "-" if frac is None else f"{100 * frac:.1f}%"
            lines.append(f"{backend:<9}{row['batch']:>6}{row['median_s']:>11.3f}{row['actions_per_s']:>11.1f}"
                         f"{row['decisions_per_s']:>13.2f}{_fmt(row.get('tflops'), '.3g'):>9}{pct:>7}{gib:>9.1f}"
                         f"  {row['actions']}")
        for skip in phase.get("skipped", []):
            lines.append(f"{backend:<9}{skip['batch']:>6}  skipped: {skip['reason']}")
        if phase.get("status") in ("error", "skipped"):
            lines.append(f"{backend:<9} {phase['status'].upper()}: {phase['error'][-800:]}")
    if sg := data.get("sglang"):
        server = sg.get("server_args", {})
        notes = " ".join(sg.get("notes", []))
        batches = sorted({int(b) for b in re.findall(r"Prepared latents with shape \((\d+),", notes)})
        backend = re.search(r"Attention backends for transformer: (\S+)", notes)
        lines.append(f"sglang {sg.get('sglang_version')}: startup {sg.get('startup_s', '-')} s, dit_cpu_offload "
                     f"{server.get('dit_cpu_offload')}, attention {backend.group(1) if backend else '?'}, latent "
                     f"batch dims {batches}, leftovers killed {sg.get('leftover_pids_killed')}, GPU MiB before "
                     f"launch/after stop {sg.get('gpu_used_mib_before_launch')}/{sg.get('gpu_used_mib_after_stop')}")
    if (emb := data.get("embedded")) and (f := emb.get("flops")):
        n = f["steps"]
        t = {k: f"{f[k] / 1e12:.3g}" for k in ("diffusers_request", "fixed", "per_step", "per_step_und",
                                                  "per_step_gen", "sglang_request", "sglang_fixed")}
        check = f.get("batch_check") or {}
        lines.append(f"TFLOP/observation: diffusers {t['diffusers_request']} = fixed {t['fixed']} + {n} x "
                     f"{t['per_step']} (UND {t['per_step_und']} + GEN {t['per_step_gen']}; tokens UND "
                     f"{f['tokens']['und']:g}, GEN {f['tokens']['gen']:g}); SGLang {t['sglang_request']} (1-frame VAE "
                     f"{t['sglang_fixed']}, text K/V cached);"
                     f" {n}-step count = extrapolation: {f['extrapolation_matches_count']}; batch {check.get('batch')}"
                     f" / batch-1 x b: step {_fmt(check.get('per_step_ratio_to_batch_1'), '.4f')}, fixed "
                     f"{_fmt(check.get('fixed_ratio_to_batch_1'), '.4f')}")
    head = data.get("headline", {})
    gains = ", ".join(f"{b} {v[k]:.2f}x" for b, v in head.get("batching_gain", {}).items() for k in v)
    versus = ", ".join(f"b{b} {v:.2f}x" for b, v in head.get("sglang_vs_embedded", {}).items())
    lines.append(f"actions/s batch 8 vs 1: {gains or '-'} | sglang vs embedded: {versus or '-'}")
    lines.append("mem GiB: GPU peak of the server's processes | embedded: GPU used minus baseline (host RSS "
                 "on CPU); TFLOP/s: sglang at its own work (1-frame VAE, text K/V cached), embedded at diffusers'")
    lines.append(f"JSON: {data['out']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    budget = Budget(args.time_budget_s or None)  # 0: no budget, as before
    work_dir = (args.work_dir or Path(tempfile.mkdtemp(prefix="serve_actions_"))).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    out = args.out or results_path("serve_actions", device_slug(args.device), stamp)
    report = Report(out.resolve())
    data = report.data
    data.update(out=report.path, command=sys.argv, args=vars(args), machine=machine(args.device),
                work_dir=work_dir)
    report.save()

    model_dir, model_info = prepare_model(args, work_dir)
    name = f"Cosmos3 {args.preset} (random weights)" if args.preset else model_dir.name
    data["model"] = {"path": model_dir, "name": name, **model_info}
    report.save()
    data["matmul"] = measure_matmul(args.device, torch.bfloat16, args.matmul_size)
    release_gpu()
    logger.info("bf16 matmul %d^3: %.1f TFLOP/s", args.matmul_size, data["matmul"]["tflops"])
    report.save()

    stats = args.stats_path or write_synthetic_action_stats(work_dir / "stats.json")
    model_cfg = validate_rollout_model(RolloutModelConfig(
        model_path=str(model_dir), action_stats_path=str(stats), action_normalization="quantile_rot",
        num_inference_steps=args.inference_steps, seed=args.seed))
    adapter = Cosmos3ActionAdapter(model_cfg, batching_max_size=args.max_batch, response_format="raw")
    count = max(args.warmup + args.repeats, args.embedded_repeats)
    requests = build_requests(adapter, [1, args.flops_batch, *args.batch_sizes], count, args.seed)
    params = requests[1][0].payload["parameters"]
    data["request"] = {**params, "prompt": PROMPT, "prompt_tokens": requests[1][0].group.token_length,
                       "view_size": VIEW_SIZE, "batch_is": "one request of b observations, one prompt group"}
    report.save()

    ctx = Context(args, model_cfg, adapter, requests, budget, report,
                  ((args.log_dir or work_dir / "logs") / stamp).resolve(),
                  physical_gpu() if args.device == "cuda" else None,
                  phases=list(args.backends))
    for backend in args.backends:
        logger.info("%s phase (%.0f s into the run)", backend, budget.elapsed())
        (run_sglang if backend == "sglang" else run_embedded)(ctx)
    finalize(data)
    data["elapsed_s"] = round(budget.elapsed(), 1)
    report.save()
    print(table(data))
    return 0 if all(data[b]["status"] == "ok" for b in args.backends) else 1


if __name__ == "__main__":
    sys.exit(main())

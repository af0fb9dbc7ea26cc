"""Eval throughput: serial baseline vs batching vs pipelining, against the sim-only and inference-only bounds.

One workload (LIBERO envs, a Cosmos3 model behind the configured rollout backend), measured as
env-steps/s in one run:

* ``serial``      one env's observation per request, requests one after another, then the chunk step;
                  nothing overlaps (a small driver over the library's env workers, adapter and backend);
* ``S=s,B=b``     :class:`PipelinedEvalRunner`'s loop with ``pipeline_stage_num=s`` and
                  ``batching_max_size=b`` (``S=1,B=E/W`` is "batching alone");
* ``sim-only``    the same episodes stepped with a fixed no-op chunk, no inference (all of a worker's
                  envs in one stage, i.e. the simulator at its most parallel);
* ``inference-only`` per configuration, the same requests (same real observations, batch sizes,
                  number of concurrent stage loops and chunk steps) served with no simulation.

A configuration's bound is ``min(sim-only rate, its inference-only rate)`` (time bound
``max(sim time, inference time)``: perfect overlap). Every rate comes twice: over the whole ``wall``
(first observation -> last chunk step, so env build, reset and the first settle steps included) and
``steady`` (from the end of the first observation, i.e. the first request, to the last chunk step,
counting the env steps less the settle steps run inside the first observation), each against the
bound computed the same way (inference-only time is all after the first observation anyway).
An untimed warm-up (a short sim-only pass, ``--no-warmup`` skips it) comes first, so the timed
sim-only row -- which must run before the others, since the inference-only replays reuse its
observations -- is not the one that pays for a cold machine (file cache, first EGL/MuJoCo loads);
likewise one untimed prediction per batch size warms the backend before anything is timed on it.
One backend (started once, with the largest batch size) serves every row: it is handed to
``PipelinedEvalRunner.run(cluster, backend=...)``, which leaves it running. Episodes run to the step cap
(``stop_on_success=false``) so every configuration does exactly the same env steps.

    .venv/bin/python benchmarks/eval_throughput.py                      # CPU default, ~10 min on 2 cores
    .venv/bin/python benchmarks/eval_throughput.py --model-path /models/cosmos3_nano --stats-path s.json \\
        --num-envs 128 --num-workers 8 --servers 8 --gpus-per-server 1 --inference-steps 30 \\
        --steps 220 --batch-sizes 8,16 --stages 1,2,4                     # GPU host
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cosmos3.cluster import Cluster
from rlinf_cosmos3.config.cluster import ClusterConfig
from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.config.libero_suites import ACTION_DIM, NOOP_ACTION, NUM_SETTLE_STEPS
from rlinf_cosmos3.models.cosmos3.domains import ACTION_HORIZON
from rlinf_cosmos3.runners.eval_runner import PipelinedEvalRunner
from rlinf_cosmos3.runners.eval_summary import EvalSummary
from rlinf_cosmos3.validation.eval import load_eval_config
from rlinf_cosmos3.workers.env.libero_env_worker import start_env_workers
from rlinf_cosmos3.workers.env.stage import StageOutput
from rlinf_cosmos3.workers.observation_keys import SLOT_IDS, TASK_DESCRIPTIONS
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.backend import RolloutBackend
from rlinf_cosmos3.workers.rollout.factory import make_backend

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the scripts' shared _common
from _common import host_info, results_path, write_json  # noqa: E402

logger = logging.getLogger("benchmarks.eval_throughput")

# A command that keeps the arm still with the gripper open (the library's no-op), for the sim-only chunks.
NOOP_COMMAND = np.asarray(NOOP_ACTION, dtype=np.float32)


@dataclass
class Row:
    """One measured configuration."""

    name: str
    kind: str
    """``serial`` | ``pipelined`` | ``sim_only``."""
    stages: int
    batch_size: int
    """Largest request; ``effective_batch`` = min(batch_size, envs per stage)."""
    effective_batch: int
    wall_time_s: float
    env_steps: int
    stage_chunk_steps: int = 0
    """Chunk steps summed over stage loops (the runner's ``chunk_requests``); HTTP requests are
    ``inference_only_requests`` (the replay sends exactly the run's requests)."""
    inference_only_s: float | None = None
    inference_only_requests: int = 0
    steady_time_s: float = 0.0
    """From the end of the first observation (the first request) to the last chunk step."""
    steady_env_steps: int = 0
    """``env_steps`` less the settle steps run inside the first observation."""
    inference_wait_s: float = 0.0
    """Pipelined rows: the runner's wait for actions / for chunk steps, summed over stage loops."""
    sim_wait_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.env_steps / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def steady_rate(self) -> float:
        return self.steady_env_steps / self.steady_time_s if self.steady_time_s > 0 else 0.0


# ---------------------------------------------------------------------------------------------- config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("sglang", "embedded"), default="sglang")
    p.add_argument("--num-envs", type=int, default=4, help="E: simulator processes in total")
    p.add_argument("--num-workers", type=int, default=1, help="W: env worker actors")
    p.add_argument("--steps", type=int, default=42,
                   help="episode step cap, settle steps included (42 = 10 settle + 2 chunks of 16)")
    p.add_argument("--settle-steps", type=int, default=NUM_SETTLE_STEPS)
    p.add_argument("--no-serial-replay", dest="serial_replay", action="store_false",
                   help="skip the serial row's inference-only replay (one request per env and chunk: the "
                        "longest replay; only the serial row's own bound needs it)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed warm-up pass (settle + one chunk per env) before the timed rows")
    p.add_argument("--episodes-per-env", type=int, default=1)
    p.add_argument("--suite", default="libero_spatial")
    p.add_argument("--task-ids", default="0", help="comma-separated task ids; episodes go task-major")
    p.add_argument("--inference-steps", type=int, default=2, help="denoising steps per request")
    p.add_argument("--servers", type=int, default=1, help="SGLang servers (or embedded workers)")
    p.add_argument("--gpus-per-server", type=int, default=0, help="0 = serve on CPU")
    p.add_argument("--stages", default="1,2,4", help="pipeline_stage_num values S")
    p.add_argument("--batch-sizes", default=None,
                   help="batching_max_size values (default: 1 and E/W); per S only distinct "
                        "effective sizes min(B, E/(W*S)) are run")
    p.add_argument("--model-path", type=Path, default=None,
                   help="diffusers Cosmos3 directory (default: write a random --preset model to the work dir)")
    p.add_argument("--preset", choices=("tiny", "nano"), default="tiny",
                   help="random model written when no --model-path is given (nano: Cosmos3-Nano's architecture, "
                        "weights generated on the GPU, ~33 GB on disk)")
    p.add_argument("--stats-path", type=Path, default=None,
                   help="action stats JSON (default: synthetic stats in the work dir; a random model's "
                        "actions are meaningless anyway)")
    p.add_argument("--height", type=int, default=192)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--num-cpus", type=int, default=None, help="Ray CPUs (default: all cores)")
    p.add_argument("--work-dir", type=Path, default=None, help="run dirs and server logs (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: benchmarks/results/eval_throughput_<host>_<date>.json)")
    args = p.parse_args(argv)
    args.task_ids = [int(t) for t in args.task_ids.split(",") if t.strip()]
    args.stages = [int(s) for s in args.stages.split(",") if s.strip()]
    per_worker = args.num_envs // args.num_workers
    args.batch_sizes = ([int(b) for b in args.batch_sizes.split(",") if b.strip()] if args.batch_sizes
                        else sorted({1, per_worker}))
    return args


def eval_config(args: argparse.Namespace, stages: int, batch: int, run_root: Path,
                steps: int | None = None) -> EvalConfig:
    """The eval config of one configuration (validated by the library); ``steps`` overrides the cap."""
    trials = args.num_envs * args.episodes_per_env // len(args.task_ids)
    raw = {
        "cluster": {"num_cpus": args.num_cpus},
        "runner": {"logs_dir": str(run_root), "experiment_name": "eval_throughput"},
        "env": {"eval": {
            "suite": args.suite, "task_ids": args.task_ids, "trials_per_task": trials,
            "total_num_envs": args.num_envs, "num_workers": args.num_workers,
            "max_episode_steps": steps or args.steps, "num_settle_steps": args.settle_steps,
            "stop_on_success": False, "save_video": "none",
        }},
        "rollout": {
            "rollout_backend": args.backend, "pipeline_stage_num": stages,
            "model": {"model_path": str(args.model_path), "action_stats_path": str(args.stats_path),
                      "action_normalization": "quantile_rot", "num_inference_steps": args.inference_steps,
                      "height": args.height, "width": args.width},
            "sglang": {"num_servers": args.servers, "gpus_per_server": args.gpus_per_server,
                       "batching_max_size": batch, "sleep_on_idle": True},
            "embedded": {"num_workers": args.servers, "gpus_per_worker": min(1, args.gpus_per_server),
                         "batching_max_size": batch},
        },
    }
    return load_eval_config(raw)


# ---------------------------------------------------------------------------------------------- drivers


@dataclass
class SimOnly:
    wall_time_s: float
    env_steps: int
    chunk_steps_per_worker: list[int]
    first_obs: list[dict[str, Any]]
    """Each worker's first observation batch (all its envs), replayed by the inference-only runs."""
    steady_time_s: float = 0.0
    steady_env_steps: int = 0

    @property
    def rate(self) -> float:
        return self.env_steps / self.wall_time_s

    @property
    def steady_rate(self) -> float:
        return self.steady_env_steps / self.steady_time_s if self.steady_time_s > 0 else 0.0


@dataclass
class _LoopStats:
    """One driver loop's counts: env steps, chunk steps, when its first observation ended
    (``time.perf_counter``) and the settle steps that observation ran."""

    steps: int
    chunks: int
    first_obs_end: float
    first_settle_steps: int
    first_obs: dict[str, Any]


async def _sim_only_loop(actor: Any, settle_steps: int) -> _LoopStats:
    out: StageOutput = await actor.observe.remote(0)
    first_end = time.perf_counter()
    first, steps, chunks = out.obs, 0, 0
    while True:
        steps += sum(r.steps for r in out.results)
        if out.done or out.num_envs == 0:
            return _LoopStats(steps, chunks, first_end, len(first[SLOT_IDS]) * settle_steps, first)
        actions = np.broadcast_to(NOOP_COMMAND, (out.num_envs, ACTION_HORIZON, ACTION_DIM)).copy()
        chunks += 1
        out = await actor.chunk_step.remote(0, actions, out.obs[SLOT_IDS])


def run_sim_only(cfg: EvalConfig, cluster: Cluster) -> SimOnly:
    """Step every episode with the no-op chunk, all of a worker's envs at once (``cfg`` has S=1)."""
    with start_env_workers(cluster, cfg.env.eval, 1) as envs:
        envs.call("setup")
        try:
            t0 = time.perf_counter()
            settle = cfg.env.eval.num_settle_steps
            loops = asyncio.run(_gather(*(_sim_only_loop(a, settle) for a in envs.actors)))
            end = time.perf_counter()
        finally:
            envs.call("close")
    steps = sum(lp.steps for lp in loops)
    return SimOnly(end - t0, steps, [lp.chunks for lp in loops], [lp.first_obs for lp in loops],
                   steady_time_s=end - min(lp.first_obs_end for lp in loops),
                   steady_env_steps=steps - sum(lp.first_settle_steps for lp in loops))


async def _gather(*coros: Any) -> list[Any]:
    return list(await asyncio.gather(*coros))


async def _serial_loop(actors: list[Any], adapter: Cosmos3ActionAdapter,
                       backend: RolloutBackend) -> tuple[int, int, float, int]:
    """Worker after worker, env after env: one single-observation request at a time, then the step.
    Returns env steps, chunk steps, when the observations ended (perf_counter) and their env count."""
    outs = [await a.observe.remote(0) for a in actors]
    first_end, first_envs = time.perf_counter(), sum(o.num_envs for o in outs)
    steps = chunk_steps = 0
    while True:
        for i, actor in enumerate(actors):
            out = outs[i]
            steps += sum(r.steps for r in out.results)
            out.results = []
            if out.done or out.num_envs == 0:
                continue
            groups = adapter.request_groups(out.obs)
            results = []
            for group in groups:  # strictly one request in flight
                (raw,) = await backend.generate([adapter.build_request(group)])
                results.append(adapter.parse_response(raw, group))
            actions = adapter.restore_order(groups, results, len(out.obs[TASK_DESCRIPTIONS]))
            outs[i] = await actor.chunk_step.remote(0, actions, out.obs[SLOT_IDS])
            chunk_steps += 1
        if all(o.done and not o.results for o in outs):
            return steps, chunk_steps, first_end, first_envs


def run_serial(cfg: EvalConfig, cluster: Cluster, backend: RolloutBackend) -> Row:
    """The baseline (``cfg`` has S=1); ``backend`` is already started."""
    adapter = Cosmos3ActionAdapter(cfg.rollout.model, 1)
    with start_env_workers(cluster, cfg.env.eval, 1) as envs:
        envs.call("setup")
        try:
            t0 = time.perf_counter()
            steps, chunk_steps, first_end, first_envs = asyncio.run(_serial_loop(envs.actors, adapter, backend))
            end = time.perf_counter()
        finally:
            envs.call("close")
    return Row("serial (1 obs/request, no overlap)", "serial", 1, 1, 1, end - t0, steps, chunk_steps,
               steady_time_s=end - first_end, steady_env_steps=steps - first_envs * cfg.env.eval.num_settle_steps)


def _stage_rows(obs: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    return {k: v[start:stop] for k, v in obs.items()}


async def _inference_only(sim: SimOnly, stages: int, batch: int, serial: bool, model_cfg: Any,
                          backend: RolloutBackend) -> tuple[float, int]:
    """Serve what a run with ``stages``/``batch`` sends, without simulation: per worker, ``stages``
    concurrent loops of ``chunk_steps`` predictions on that stage's slice of the real observations
    (``serial``: one request at a time over all of them)."""
    adapter = Cosmos3ActionAdapter(model_cfg, batch)
    slices: list[tuple[dict[str, Any], int]] = []
    for obs, chunks in zip(sim.first_obs, sim.chunk_steps_per_worker, strict=True):
        n = len(obs[SLOT_IDS])
        per_stage = n // stages
        slices += [(_stage_rows(obs, s * per_stage, (s + 1) * per_stage), chunks) for s in range(stages)]
    # Tokenizer load and prompt lengths outside the timing; also the request count of each slice.
    groups_per_slice = [len(adapter.request_groups(obs)) for obs, _ in slices]
    counts = [sum(g * chunks for g, (_, chunks) in zip(groups_per_slice, slices, strict=True))] if not serial else [0]

    async def loop(obs: dict[str, Any], chunks: int) -> None:
        for _ in range(chunks):
            await adapter.predict(obs, backend)

    t0 = time.perf_counter()
    if serial:
        for obs, chunks in slices:
            for _ in range(chunks):
                for group in adapter.request_groups(obs):
                    (raw,) = await backend.generate([adapter.build_request(group)])
                    adapter.parse_response(raw, group)
                    counts[0] += 1
    else:
        await asyncio.gather(*(loop(obs, chunks) for obs, chunks in slices))
    return time.perf_counter() - t0, counts[0]


async def _warm_backend(sim: SimOnly, batch_sizes: list[int], model_cfg: Any, backend: RolloutBackend) -> None:
    """One untimed prediction at every batch size the rows use: a fresh server's first request of a
    new shape pays one-off costs (kernel selection, allocator growth) -- 3x a warm request of 16
    observations on the H200 -- which must not land in whichever replay or row comes first."""
    obs = sim.first_obs[0]
    for size in sorted(set(batch_sizes)):
        size = min(size, len(obs[SLOT_IDS]))
        await Cosmos3ActionAdapter(model_cfg, size).predict(_stage_rows(obs, 0, size), backend)


def run_pipelined(cfg: EvalConfig, cluster: Cluster, backend: RolloutBackend, run_dir: Path) -> EvalSummary:
    """The runner itself on the shared, already started ``backend`` (which it leaves running)."""
    summary = PipelinedEvalRunner(cfg, run_dir).run(cluster, backend=backend)
    if summary.num_errors:
        raise RuntimeError(f"{summary.num_errors} episodes failed in {run_dir} (see its results.jsonl)")
    return summary


# ---------------------------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    info = host_info()
    try:
        import torch

        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except (ImportError, RuntimeError) as err:
        info["gpus_error"] = str(err)
    return info


def _bound(rate: float, steps: int, sim_rate: float, inference_only_s: float | None) -> dict[str, float | None]:
    """Inference-only rate, bound ``min(sim-only, inference-only)`` and the fraction of it reached."""
    inf_rate = steps / inference_only_s if inference_only_s else None
    bound = min(sim_rate, inf_rate) if inf_rate else None
    return {"inference_only": inf_rate, "bound": bound, "fraction": rate / bound if bound else None}


def table(rows: list[Row], sim: SimOnly, baseline: Row) -> tuple[str, list[dict[str, Any]]]:
    """The printed table (whole-wall columns, then steady ones) and the per-row derived figures."""
    head = (f"{'configuration':<36} {'steps/s':>8} {'x serial':>8} {'inf-only/s':>10} {'bound/s':>8} "
            f"{'of bound':>8} {'wall s':>7} | {'steady/s':>8} {'x serial':>8} {'bound/s':>8} {'of bound':>8} "
            f"{'steady s':>8} {'requests':>8}")
    lines, derived = [head, "-" * len(head)], []
    for row in rows:
        whole = _bound(row.rate, row.env_steps, sim.rate, row.inference_only_s)
        steady = _bound(row.steady_rate, row.steady_env_steps, sim.steady_rate, row.inference_only_s)
        d = {"env_steps_per_s": row.rate, "ratio_to_serial": row.rate / baseline.rate,
             "inference_only_env_steps_per_s": whole["inference_only"], "bound_env_steps_per_s": whole["bound"],
             "fraction_of_bound": whole["fraction"],
             "steady_env_steps_per_s": row.steady_rate,
             "steady_ratio_to_serial": row.steady_rate / baseline.steady_rate if baseline.steady_rate else None,
             "steady_inference_only_env_steps_per_s": steady["inference_only"],
             "steady_bound_env_steps_per_s": steady["bound"], "steady_fraction_of_bound": steady["fraction"]}
        derived.append(d)
        lines.append(f"{row.name:<36} {row.rate:>8.2f} {d['ratio_to_serial']:>8.2f} "
                     f"{(whole['inference_only'] or 0):>10.2f} {(whole['bound'] or 0):>8.2f} "
                     f"{(whole['fraction'] or 0):>8.2f} {row.wall_time_s:>7.1f} | {row.steady_rate:>8.2f} "
                     f"{(d['steady_ratio_to_serial'] or 0):>8.2f} {(steady['bound'] or 0):>8.2f} "
                     f"{(steady['fraction'] or 0):>8.2f} {row.steady_time_s:>8.1f} {row.inference_only_requests:>8d}")
    lines.append(f"{'sim-only (no-op chunks, no inference)':<36} {sim.rate:>8.2f} "
                 f"{sim.rate / baseline.rate:>8.2f} {'':>10} {'':>8} {'':>8} {sim.wall_time_s:>7.1f} | "
                 f"{sim.steady_rate:>8.2f} "
                 f"{(sim.steady_rate / baseline.steady_rate if baseline.steady_rate else 0):>8.2f} "
                 f"{'':>8} {'':>8} {sim.steady_time_s:>8.1f}")
    return "\n".join(lines), derived


# ---------------------------------------------------------------------------------------------- main


def configurations(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(S, B, effective B) for every S and distinct effective batch size."""
    out, seen = [], set()
    for s in args.stages:
        per_stage = args.num_envs // (args.num_workers * s)
        for b in args.batch_sizes:
            eff = min(b, per_stage)
            if per_stage >= 1 and (s, eff) not in seen:
                seen.add((s, eff))
                out.append((s, b, eff))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eval_throughput_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model_path is None:
        from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir, write_random_weights

        args.model_path = write_model_dir(work / f"model_{args.preset}", preset=args.preset, seed=0, overwrite=True)
        if args.preset == "nano":  # configs only: the ~31 GB of random bf16 weights are made on the GPU
            write_random_weights(args.model_path, device="cuda")
    if args.stats_path is None:
        from rlinf_cosmos3.models.cosmos3.tiny import write_synthetic_action_stats

        args.stats_path = write_synthetic_action_stats(work / "stats.json")
    configs = configurations(args)
    max_batch = max(b for _, b, _ in configs)
    base_cfg = eval_config(args, 1, max_batch, work / "runs")  # validates the layout up front
    for s, b, _ in configs:
        eval_config(args, s, b, work / "runs")
    logger.info("work dir %s; configurations (S, B): %s", work, [(s, b) for s, b, _ in configs])

    out = args.out or results_path("eval_throughput", socket.gethostname())
    partial = out.with_name(out.stem + ".partial.json")

    def save_partial() -> None:
        """Rows measured so far, so a run cut short (a device time limit) still leaves its numbers."""
        sim_fields = {k: getattr(sim, k) for k in ("wall_time_s", "env_steps", "steady_time_s", "steady_env_steps")}
        write_json(partial, {"sim_only": sim_fields, "rows": [asdict(r) for r in rows]})

    started = time.time()
    rows: list[Row] = []
    with Cluster(ClusterConfig(num_cpus=args.num_cpus)) as cluster:
        if args.warmup:
            logger.info("== warm-up (untimed)")
            warm_cap = min(args.steps, args.settle_steps + ACTION_HORIZON)
            run_sim_only(eval_config(args, 1, max_batch, work / "runs", steps=warm_cap), cluster)
        logger.info("== sim-only")
        sim = run_sim_only(base_cfg, cluster)
        logger.info("sim-only: %d env steps in %.1f s", sim.env_steps, sim.wall_time_s)
        save_partial()

        backend = make_backend(args.backend, base_cfg.rollout.model, sglang_cfg=base_cfg.rollout.sglang,
                               embedded_cfg=base_cfg.rollout.embedded, log_dir=work / "servers", cluster=cluster)
        with backend:
            logger.info("== server warm-up (untimed): one prediction per batch size %s",
                        sorted({1, *(eff for _, _, eff in configs)}))
            asyncio.run(_warm_backend(sim, [1, *(eff for _, _, eff in configs)], base_cfg.rollout.model, backend))
            logger.info("== inference-only")
            serial_inf = (asyncio.run(_inference_only(sim, 1, 1, True, base_cfg.rollout.model, backend))
                          if args.serial_replay else (None, 0))
            inf = {(s, eff): asyncio.run(_inference_only(sim, s, eff, False, base_cfg.rollout.model, backend))
                   for s, _, eff in configs}
            logger.info("== serial baseline")
            baseline = run_serial(base_cfg, cluster, backend)
            baseline.inference_only_s, baseline.inference_only_requests = serial_inf
            rows.append(baseline)
            save_partial()

            for s, b, eff in configs:
                name = f"pipelined S={s} B={eff}" + (" (batching alone)" if s == 1 and eff == max_batch else "")
                logger.info("== %s", name)
                run_dir = work / "runs" / f"S{s}_B{eff}"
                run_dir.mkdir(parents=True, exist_ok=True)
                summary = run_pipelined(eval_config(args, s, eff, work / "runs"), cluster, backend, run_dir)
                row = Row(name, "pipelined", s, b, eff, summary.wall_time_s, summary.env_steps,
                          summary.chunk_requests, steady_time_s=summary.steady_time_s,
                          steady_env_steps=summary.steady_env_steps, inference_wait_s=summary.inference_wait_s,
                          sim_wait_s=summary.sim_wait_s)
                logger.info("%s: stages waited %.1f s on inference (%.2f s per chunk), %.1f s on simulation "
                            "(%.2f s per chunk step)", name, summary.inference_wait_s,
                            summary.inference_wait_s / max(1, summary.chunk_requests), summary.sim_wait_s,
                            summary.sim_wait_s / max(1, summary.chunk_requests))
                row.inference_only_s, row.inference_only_requests = inf[(s, eff)]
                rows.append(row)
                save_partial()

    expected = args.num_envs * args.episodes_per_env * args.steps
    for row in rows:
        if row.env_steps != expected:
            raise RuntimeError(f"{row.name}: {row.env_steps} env steps, expected {expected}")
    text, derived = table(rows, sim, baseline)
    print(text)  # the table is this script's output

    report = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "total_wall_s": time.time() - started,
        "env_steps_per_run": expected,
        "sim_only": {"wall_time_s": sim.wall_time_s, "env_steps": sim.env_steps,
                     "env_steps_per_s": sim.rate, "chunk_steps_per_worker": sim.chunk_steps_per_worker,
                     "steady_time_s": sim.steady_time_s, "steady_env_steps": sim.steady_env_steps,
                     "steady_env_steps_per_s": sim.steady_rate},
        "rows": [{**asdict(r), **d} for r, d in zip(rows, derived, strict=True)],
        "table": text,
    }
    write_json(out, report)
    partial.unlink(missing_ok=True)
    logger.info("results: %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

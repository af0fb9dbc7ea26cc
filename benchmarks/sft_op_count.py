"""Host work of one SFT step - dispatched operations, host syncs, Python calls, time - and what each sample adds
(CPU, any machine); with ``--baseline REV``, the same figures for the library at git revision REV beside them.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sft_op_count.py --micro-batches 8 16 [--preset tiny|small] \\
        [--trainable recipe|all] [--baseline HEAD~1] [--top 25] [--out result.json]

Why: with a small model on a GPU the step's time is the host's, one Python dispatch and one kernel launch
per operation, so the operations a step dispatches - and above all the ones each sample adds - and the Python
around them are what bounds samples/s (docs/benchmarks.md, "the launcher with packed micro-batches"). This runs
the library's own step (``components.train_step.train_step`` through ``benchmarks/gpu/sft_step.py``'s setup: the
reference recipe, packed micro-batches of cached latents, fused AdamW, EMA) once untimed, then:

* once under a ``TorchDispatchMode`` that counts every dispatched operation (forward, backward, optimizer) by
  the innermost line of this project or diffusers that issued it (a backward operation by the forward line
  whose autograd node it runs for, remembered by a ``TorchFunctionMode``), and the host-device synchronisations
  (``.item()``, ``bool(tensor)``, ``nonzero``; on the CPU they include reads of CPU tensors, which cost no
  device round trip);
* once under ``sys.setprofile``, counting Python function calls (and calls of builtins, torch ops included);
* ``--timed`` more times, reporting medians of the step and of its parts: the host work of ``sft_loss`` before
  the transformer call (encode, draws, packing, noising) and after it (the losses), the transformer's forward,
  backward, and the optimizer part (clip, AdamW, schedule, EMA). On the CPU the parts include the arithmetic.

The slope between two micro-batch sizes is the per-sample cost, and ``at_micro_batch`` extrapolates to the
small recipe's 128. On CPU the packed attention runs a per-sample SDPA loop that the GPU's FlexAttention
replaces; its lines (and their backward) are marked and left out of the ``gpu_path`` figures. On CPU the step
runs in fp32 without FSDP2 (one process, no mesh): a GPU rank's FSDP2 and DTensor work is not in these counts.

``--baseline REV`` checks REV out into a temporary git worktree and runs this same file there as a child
process with the worktree's library and ``sft_step.py`` (``PYTHONPATH``), on the same model directory, so
the two columns differ only by the library.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the scripts' shared _common
from _common import one_rank_process_group, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
_THIS_FILE = str(Path(__file__).resolve())
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select")
CPU_ONLY = ("packed_attention.py:_sdpa", "packed_attention.py:_loop", "attention_dispatch.py")
EXTRAPOLATE_TO = 128
"""The small recipe's micro-batch (examples/sft/config/libero_sft_cosmos3_small.yaml)."""


def _project_line() -> str:
    """The innermost source line of this project or diffusers on the stack (``file:function:line``)."""
    for frame in reversed(traceback.extract_stack(limit=48)):
        name = frame.filename
        if ("diffusers" in name or "rlinf_cosmos3" in name) and "_python_dispatch" not in name \
                and name != _THIS_FILE:
            short = name.split("site-packages/")[-1].split("rlinf_cosmos3/", 1)[-1]
            return f"{short}:{frame.name}:{frame.lineno}"
    return "torch (no project frame)"


class ForwardLines(TorchFunctionMode):
    """Remembers which project line created each autograd node, so backward operations can be charged to the
    forward line they differentiate (not to the ``.backward()`` call)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[Any, str] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None and tensor.grad_fn not in self.lines:
                self.lines[tensor.grad_fn] = _project_line()
        return out


class OpCounter(TorchDispatchMode):
    """Counts dispatched operations by the project/diffusers source line that issued them; a backward operation
    by the forward line of the node it runs for, marked ``(backward)``."""

    def __init__(self, forward_lines: ForwardLines) -> None:
        super().__init__()
        self.forward_lines = forward_lines
        self.by_line: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        node = torch._C._current_autograd_node()
        if node is None:
            line = _project_line()
        else:
            line = f"{self.forward_lines.lines.get(node, node.name())} (backward)"
        self.by_line[line] += 1
        if func.__name__.startswith(SYNC_OPS):
            self.syncs[line] += 1
        return func(*args, **(kwargs or {}))


def _in_cpu_attention_loop(frame: Any, depth: int = 8) -> bool:
    """Whether ``frame`` runs inside the CPU-only per-sample attention loop (see ``CPU_ONLY``)."""
    while frame is not None and depth:
        code = frame.f_code
        if code.co_filename.endswith("attention_dispatch.py") or (
                code.co_filename.endswith("packed_attention.py") and code.co_name in ("_loop", "_sdpa")):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


class CallCounter:
    """``sys.setprofile`` hook: Python function calls and builtin calls (torch's C functions among them), and
    how many of them the CPU-only attention loop made."""

    def __init__(self) -> None:
        self.python = 0
        self.builtin = 0
        self.cpu_attention_loop = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.python += 1
        elif event == "c_call":
            self.builtin += 1
        else:
            return
        if _in_cpu_attention_loop(frame):
            self.cpu_attention_loop += 1


class PartTimer:
    """Times the parts of ``sft_loss`` around the transformer call with hooks on the library's own objects."""

    def __init__(self, policy: Any) -> None:
        self.parts: dict[str, float] = collections.defaultdict(float)
        self._mark = 0.0
        transformer = policy.transformer
        self.handles = [transformer.register_forward_pre_hook(self._before),
                        transformer.register_forward_hook(self._after)]
        self._policy, self._sft_loss = policy, policy.sft_loss

        def timed_sft_loss(*args: Any, **kwargs: Any) -> Any:
            self._mark = time.perf_counter()
            result = self._sft_loss(*args, **kwargs)
            self.parts["loss_after_transformer_s"] += time.perf_counter() - self._mark
            return result

        policy.sft_loss = timed_sft_loss

    def _before(self, *_: Any) -> None:
        now = time.perf_counter()
        self.parts["loss_before_transformer_s"] += now - self._mark
        self._mark = now

    def _after(self, *_: Any) -> None:
        now = time.perf_counter()
        self.parts["transformer_forward_s"] += now - self._mark
        self._mark = now

    def take(self) -> dict[str, float]:
        parts, self.parts = dict(self.parts), collections.defaultdict(float)
        return parts

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        delattr(self._policy, "sft_loss")  # the class's method again


def measure_step(bench: Any, micro_batch: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Operations, syncs, Python calls and time of one packed step of ``micro_batch`` samples."""
    layers = json.loads((args.model_dir / "transformer" / "config.json").read_text())["num_hidden_layers"]
    argv = ["--device", "cpu", "--model-dir", str(args.model_dir), "--layers", str(layers), "--variants",
            f"{args.optimizer}+ema+pack+mb{micro_batch}", "--global-batch", str(micro_batch), "--seed", "3",
            "--trainable", args.trainable, "--distinct-samples", str(min(micro_batch, 4))]
    if args.cpu_threads:
        argv += ["--cpu-threads", str(args.cpu_threads)]
    bench_args = bench.parse_args(argv)
    setup = bench.prepare(bench_args, torch.device("cpu"), bench_args.variant_list, workdir / f"mb{micro_batch}")
    trainer = bench.build(setup, bench_args.variant_list[0])
    step = 0
    bench.timed_step(setup, trainer, step)
    step += 1
    forward_lines = ForwardLines()
    ops = OpCounter(forward_lines)
    with forward_lines, ops:
        bench.timed_step(setup, trainer, step)
    forward_lines.lines.clear()  # the nodes (and what they saved) may go
    step += 1
    calls = CallCounter()
    sys.setprofile(calls)
    try:
        bench.timed_step(setup, trainer, step)
    finally:
        sys.setprofile(None)
    step += 1
    timer = PartTimer(trainer.policy)
    timings: list[dict[str, float]] = []
    try:
        for _ in range(args.timed):
            t0 = time.perf_counter()
            result = bench.timed_step(setup, trainer, step)
            step += 1
            parts = timer.take()
            parts["step_s"] = time.perf_counter() - t0
            parts["optimizer_s"] = result.optimizer_s
            parts["backward_s"] = result.forward_backward_s - sum(  # with the loader call and loss sums
                parts.get(k, 0.0) for k in ("loss_before_transformer_s", "transformer_forward_s",
                                            "loss_after_transformer_s"))
            timings.append(parts)
    finally:
        timer.remove()
    return {
        "ops": sum(ops.by_line.values()),
        "ops_by_line": dict(ops.by_line),
        "syncs": dict(ops.syncs),
        "python_calls": calls.python,
        "builtin_calls": calls.builtin,
        "calls_in_cpu_attention_loop": calls.cpu_attention_loop,
        "time_s": {key: statistics.median(t[key] for t in timings) for key in timings[0]},
    }


def _is_cpu_only(line: str) -> bool:
    return any(marker in line for marker in CPU_ONLY)


def report(counts: dict[int, dict[str, Any]], top: int) -> dict[str, Any]:
    """Totals per step, per extra sample (the slope between the two sizes), and extrapolated to 128 samples;
    ``gpu_path`` figures leave out what the CPU-only attention loop dispatched (its FlexAttention calls on a GPU
    are a few per layer, not counted here)."""
    small, large = sorted(counts)[0], sorted(counts)[-1]
    extra = large - small
    lines = set(counts[small]["ops_by_line"]) | set(counts[large]["ops_by_line"])
    per_sample = {line: (counts[large]["ops_by_line"].get(line, 0) - counts[small]["ops_by_line"].get(line, 0))
                  / extra for line in lines}
    for c in counts.values():
        c["gpu_path_ops"] = c["ops"] - sum(n for line, n in c["ops_by_line"].items() if _is_cpu_only(line))
        c["gpu_path_calls"] = c["python_calls"] + c["builtin_calls"] - c["calls_in_cpu_attention_loop"]

    def slope(key: str) -> float:
        return (counts[large][key] - counts[small][key]) / extra

    def at(key: str, micro_batch: int) -> float:
        return counts[small][key] + slope(key) * (micro_batch - small)

    return {
        "micro_batches": [small, large],
        "ops_per_step": {mb: c["ops"] for mb, c in counts.items()},
        "ops_per_extra_sample": slope("ops"),
        "gpu_path_ops_per_step": {mb: c["gpu_path_ops"] for mb, c in counts.items()},
        "gpu_path_ops_per_extra_sample": slope("gpu_path_ops"),
        "gpu_path_fixed_ops_per_step": at("gpu_path_ops", 0),
        "python_calls_per_step": {mb: c["python_calls"] for mb, c in counts.items()},
        "builtin_calls_per_step": {mb: c["builtin_calls"] for mb, c in counts.items()},
        "calls_in_cpu_attention_loop_per_step": {mb: c["calls_in_cpu_attention_loop"] for mb, c in counts.items()},
        "gpu_path_calls_per_step": {mb: c["gpu_path_calls"] for mb, c in counts.items()},
        "gpu_path_calls_per_extra_sample": slope("gpu_path_calls"),
        "at_micro_batch": {
            "micro_batch": EXTRAPOLATE_TO,
            "gpu_path_ops": at("gpu_path_ops", EXTRAPOLATE_TO),
            "gpu_path_calls": at("gpu_path_calls", EXTRAPOLATE_TO),
        },
        "host_syncs": {mb: sum(c["syncs"].values()) for mb, c in counts.items()},
        "host_syncs_by_line": {mb: c["syncs"] for mb, c in counts.items()},
        "time_s": {mb: c["time_s"] for mb, c in counts.items()},
        "top_lines_per_sample": dict(sorted(per_sample.items(), key=lambda kv: -kv[1])[:top]),
        "top_lines_per_step": dict(sorted(((line, n) for line, n in counts[large]["ops_by_line"].items()
                                           if not _is_cpu_only(line)), key=lambda kv: -kv[1])[:top]),
    }


def run_here(args: argparse.Namespace) -> dict[str, Any]:
    """Measure with the library this interpreter imports (``--bench-dir``'s ``sft_step.py``)."""
    sys.path.insert(0, str(args.bench_dir))
    import sft_step as bench  # the benchmark beside the library measured

    with tempfile.TemporaryDirectory() as tmp, one_rank_process_group("cpu"):
        counts = {mb: measure_step(bench, mb, args, Path(tmp)) for mb in args.micro_batches}
    return report(counts, args.top)


def run_baseline(args: argparse.Namespace, revision: str) -> dict[str, Any]:
    """This script, run in a child process against the library of git ``revision`` (a temporary worktree)."""
    with tempfile.TemporaryDirectory(prefix="sft_baseline_") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), revision], check=True,
                       capture_output=True, text=True)
        try:
            out = Path(tmp) / "baseline.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--bench-dir",
                   str(tree / "benchmarks" / "gpu"), "--model-dir", str(args.model_dir), "--trainable",
                   args.trainable, "--optimizer", args.optimizer, "--timed", str(args.timed), "--top", str(args.top),
                   "--micro-batches", *map(str, args.micro_batches), "--out", str(out)]
            if args.cpu_threads:
                cmd += ["--cpu-threads", str(args.cpu_threads)]
            env = {**os.environ, "PYTHONPATH": str(tree)}
            subprocess.run(cmd, check=True, env=env, cwd=tree)
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True)


def side_by_side(results: dict[str, dict[str, Any]]) -> list[str]:
    """The figures of each library version as columns (``results``: column name -> :func:`report`)."""
    names = list(results)
    first = results[names[0]]
    small, large = first["micro_batches"]
    rows: list[tuple[str, Any]] = [
        (f"ops per step, micro-batch {small}", lambda r: r["ops_per_step"][small]),
        (f"ops per step, micro-batch {large}", lambda r: r["ops_per_step"][large]),
        ("ops per extra sample", lambda r: r["ops_per_extra_sample"]),
        (f"GPU path: ops per step, micro-batch {large}", lambda r: r["gpu_path_ops_per_step"][large]),
        ("GPU path: ops per extra sample", lambda r: r["gpu_path_ops_per_extra_sample"]),
        ("GPU path: fixed ops per step", lambda r: r["gpu_path_fixed_ops_per_step"]),
        (f"GPU path: ops per step at micro-batch {EXTRAPOLATE_TO}", lambda r: r["at_micro_batch"]["gpu_path_ops"]),
        (f"host syncs per step, micro-batch {large}", lambda r: r["host_syncs"][large]),
        (f"Python calls per step, micro-batch {large}", lambda r: r["python_calls_per_step"][large]),
        ("GPU path: Python + builtin calls per extra sample", lambda r: r["gpu_path_calls_per_extra_sample"]),
        (f"GPU path: Python + builtin calls at micro-batch {EXTRAPOLATE_TO}",
         lambda r: r["at_micro_batch"]["gpu_path_calls"]),
    ]
    for key in ("step_s", "loss_before_transformer_s", "transformer_forward_s", "loss_after_transformer_s",
                "backward_s", "optimizer_s"):
        rows.append((f"ms {key[:-2]}, micro-batch {large}",
                     lambda r, key=key: 1e3 * r["time_s"][large].get(key, float("nan"))))
    width = max(len(label) for label, _ in rows)
    lines = [f"{'':<{width}} " + " ".join(f"{name:>14}" for name in names)]
    for label, get in rows:
        lines.append(f"{label:<{width}} " + " ".join(f"{float(get(results[n])):>14.1f}" for n in names))
    return lines


def _json_keys(result: dict[str, Any]) -> dict[str, Any]:
    """Micro-batch keys as ints again after a JSON round trip."""
    out = {}
    for key, value in result.items():
        if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
            value = {int(k): v for k, v in value.items()}
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--micro-batches", type=int, nargs=2, default=[8, 16], metavar=("SMALL", "LARGE"))
    p.add_argument("--preset", default="tiny", choices=["tiny", "small"], help="model written for the run")
    p.add_argument("--model-dir", type=Path, help="an existing model directory instead of --preset's")
    p.add_argument("--trainable", default="recipe", choices=["recipe", "all"],
                   help="all: keys_to_select=null (the small recipe's)")
    p.add_argument("--optimizer", default="fused", choices=["fused", "foreach"],
                   help="AdamW kernel (fused: what a GPU rank uses)")
    p.add_argument("--timed", type=int, default=2, help="timed steps per micro-batch size (median)")
    p.add_argument("--cpu-threads", type=int, help="torch intra-op threads (default: sft_step.py's)")
    p.add_argument("--baseline", metavar="REV", help="also measure the library at this git revision, side by side")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    p.add_argument("--bench-dir", type=Path, default=REPO / "benchmarks" / "gpu", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 2 <= args.micro_batches[0] < args.micro_batches[1]:
        p.error("--micro-batches SMALL LARGE needs 2 <= SMALL < LARGE (one sample takes diffusers' own attention, "
                "not the packed path)")
    if args.timed < 1:
        p.error("--timed must be >= 1")
    with tempfile.TemporaryDirectory(prefix="sft_op_count_model_") as tmp:
        if args.model_dir is None:
            from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

            args.model_dir = write_model_dir(Path(tmp) / args.preset, preset=args.preset, seed=0)
        if args.child:
            result = run_here(args)
            if args.out:
                write_json(args.out, result, indent=1)
            return result
        results: dict[str, dict[str, Any]] = {}
        if args.baseline:
            results[f"at {args.baseline}"] = _json_keys(run_baseline(args, args.baseline))
        results["this tree"] = run_here(args)
    current = results["this tree"]
    print(f"ops per step {current['ops_per_step']}; per extra sample {current['ops_per_extra_sample']:.0f} "
          f"({current['gpu_path_ops_per_extra_sample']:.0f} without the CPU attention loop); "
          f"fixed {current['gpu_path_fixed_ops_per_step']:.0f} without it")
    for line, n in current["top_lines_per_sample"].items():
        print(f"{n:8.1f} per sample  {line}{'  (CPU attention loop)' if _is_cpu_only(line) else ''}")
    for line, n in current["top_lines_per_step"].items():
        print(f"{n:8d} per step    {line}")
    for mb, syncs in current["host_syncs_by_line"].items():
        print(f"host syncs at micro-batch {mb}: {sum(syncs.values())} {syncs}")
    print("\n".join(side_by_side(results)))
    if args.out:
        write_json(args.out, results, indent=1)
    return results


if __name__ == "__main__":
    main()

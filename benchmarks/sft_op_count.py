"""Tensor operations dispatched per SFT step, and how many each extra sample adds (CPU, any machine).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sft_op_count.py --micro-batches 8 16 [--preset tiny] [--top 25]

Why: with a small model on a GPU the step's time is the host's, one Python dispatch and one kernel launch
per operation, so the operations a micro-batch dispatches - and above all the ones each sample adds - are
what bounds samples/s (docs/benchmarks.md, "the launcher with packed micro-batches"). This runs the library's
own step (``components.train_step.train_step`` through ``benchmarks/gpu/sft_step.py``'s setup: the reference
recipe, packed micro-batches of cached latents) once untimed and once under a ``TorchDispatchMode`` that
counts every dispatched operation (forward, backward and optimizer) by the innermost line of this project or
diffusers that issued it. The slope between two micro-batch sizes is the per-sample cost; the table lists
the lines that add most per sample, and the host-device synchronisations (``.item()``, ``bool(tensor)``).
On CPU the packed attention runs a per-sample SDPA loop that the GPU's FlexAttention replaces; its lines
are marked so they can be discounted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sft_step as bench  # noqa: E402

SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select")
CPU_ONLY = ("packed_attention.py:_sdpa", "packed_attention.py:_loop", "attention_dispatch.py")


class OpCounter(TorchDispatchMode):
    """Counts dispatched operations by the innermost project/diffusers source line (backward: its caller)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_line: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        line = "torch (no project frame)"
        for frame in reversed(traceback.extract_stack(limit=48)):
            name = frame.filename
            if ("diffusers" in name or "rlinf_cosmos3" in name) and "_python_dispatch" not in name:
                short = name.split("site-packages/")[-1].split("rlinf_cosmos3/", 1)[-1]
                line = f"{short}:{frame.name}:{frame.lineno}"
                break
        self.by_line[line] += 1
        if func.__name__.startswith(SYNC_OPS):
            self.syncs[line] += 1
        return func(*args, **(kwargs or {}))


def count_step(micro_batch: int, preset: str, workdir: Path) -> OpCounter:
    """Operations of one packed training step of ``micro_batch`` samples (after one untimed step)."""
    args = bench.parse_args(["--device", "cpu", "--preset", preset, "--variants", f"base+pack+mb{micro_batch}",
                             "--global-batch", str(micro_batch), "--seed", "3"])
    setup = bench.prepare(args, torch.device("cpu"), args.variant_list, workdir / f"mb{micro_batch}")
    trainer = bench.build(setup, args.variant_list[0])
    bench.timed_step(setup, trainer, 0)
    counter = OpCounter()
    with counter:
        bench.timed_step(setup, trainer, 1)
    return counter


def report(counts: dict[int, OpCounter], top: int) -> dict[str, Any]:
    small, large = sorted(counts)[0], sorted(counts)[-1]
    extra = large - small
    lines = set(counts[small].by_line) | set(counts[large].by_line)
    per_sample = {line: (counts[large].by_line[line] - counts[small].by_line[line]) / extra for line in lines}
    totals = {mb: sum(c.by_line.values()) for mb, c in counts.items()}
    slope = (totals[large] - totals[small]) / extra
    cpu_only = sum(v for k, v in per_sample.items() if any(m in k for m in CPU_ONLY))
    return {
        "ops_per_step": totals,
        "ops_per_extra_sample": slope,
        "ops_per_extra_sample_without_cpu_attention_loop": slope - cpu_only,
        "fixed_ops_per_step": totals[small] - slope * small,
        "top_lines_per_sample": dict(sorted(per_sample.items(), key=lambda kv: -kv[1])[:top]),
        "host_syncs": {mb: dict(c.syncs) for mb, c in counts.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--micro-batches", type=int, nargs=2, default=[8, 16], metavar=("SMALL", "LARGE"))
    p.add_argument("--preset", default="tiny", choices=["tiny", "nano"])
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.micro_batches[0] >= args.micro_batches[1]:
        p.error("--micro-batches SMALL LARGE needs SMALL < LARGE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"file://{Path(tmp) / 'pg'}", rank=0, world_size=1)
        try:
            counts = {mb: count_step(mb, args.preset, Path(tmp)) for mb in args.micro_batches}
        finally:
            dist.destroy_process_group()
    result = report(counts, args.top)
    print(f"ops per step {result['ops_per_step']}; per extra sample {result['ops_per_extra_sample']:.0f} "
          f"({result['ops_per_extra_sample_without_cpu_attention_loop']:.0f} without the CPU attention loop); "
          f"fixed {result['fixed_ops_per_step']:.0f}")
    for line, n in result["top_lines_per_sample"].items():
        print(f"{n:8.1f} per sample  {line}{'  (CPU attention loop)' if any(m in line for m in CPU_ONLY) else ''}")
    for mb, syncs in result["host_syncs"].items():
        print(f"host syncs at micro-batch {mb}: {sum(syncs.values())} {syncs}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()

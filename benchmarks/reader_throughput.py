"""Samples/s of the LIBERO training reader on one or more LeRobot v3 datasets, in one process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/reader_throughput.py \\
        --root data/libero_video data/libero_image --stats data/stats.json --samples 300

Each dataset is read with ``LiberoLeRobotDataset`` (``num_workers=0``: no DataLoader, the cost of
one sample in one process): a few untimed warm-up samples, then ``--samples`` samples at seeded
random indices (with replacement when the dataset is smaller), the same indices for every dataset.
The datasets take turns in rounds of ``--round`` samples, so a machine whose load changes during
the run weighs on all of them alike; wall time and this process's CPU time (all its threads) are
both reported, the CPU figure being the one that holds on a shared machine. Meant to compare camera
storage (``video`` = AV1/MP4 decoded by PyAV vs ``image`` = PNG in parquet) on the same episodes;
prints a table and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the scripts' shared _common
from _common import write_json  # noqa: E402

WARMUP = 5


def measure(roots: list[Path], stats: Path, samples: int, seed: int, round_size: int) -> list[dict]:
    """Time ``samples`` reads of each dataset, interleaved in rounds; returns one row per dataset."""
    readers, rows = [], []
    for root in roots:
        cfg = LiberoDataConfig(root=str(root), stats_path=str(stats), complete_chunks_only=False)  # every frame
        readers.append(LiberoLeRobotDataset(cfg))
        info = json.loads((root / "meta" / "info.json").read_text())
        rows.append({"root": str(root), "camera_storage": sorted({info["features"][k]["dtype"] for k in cfg.image_keys}),
                     "dataset_samples": len(readers[-1]), "samples": samples, "wall_s": 0.0, "cpu_s": 0.0})
    size = min(len(r) for r in readers)
    indices = np.random.default_rng(seed).integers(0, size, size=WARMUP + samples)
    for reader in readers:
        for i in indices[:WARMUP]:
            reader[int(i)]
    for start in range(WARMUP, WARMUP + samples, round_size):
        chunk = indices[start : start + round_size]
        for reader, row in zip(readers, rows, strict=True):
            wall, cpu = time.perf_counter(), time.process_time()
            for i in chunk:
                reader[int(i)]
            row["wall_s"] += time.perf_counter() - wall
            row["cpu_s"] += time.process_time() - cpu
    for row in rows:
        row.update(samples_per_s=samples / row["wall_s"], ms_per_sample=1000 * row["wall_s"] / samples,
                   cpu_ms_per_sample=1000 * row["cpu_s"] / samples, samples_per_cpu_s=samples / row["cpu_s"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, nargs="+", required=True, help="LeRobot v3 dataset directories")
    p.add_argument("--stats", type=Path, required=True, help="action stats JSON valid for the datasets")
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--round", type=int, default=25, help="samples per dataset per turn")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default: print only)")
    args = p.parse_args(argv)
    rows = measure(args.root, args.stats, args.samples, args.seed, args.round)
    load = os.getloadavg()[0]
    print(f"{'storage':<8} {'samples/s':>10} {'ms/sample':>10} {'samples/cpu-s':>14} {'cpu ms/sample':>14}  root")
    for row in rows:
        print(f"{','.join(row['camera_storage']):<8} {row['samples_per_s']:>10.1f} {row['ms_per_sample']:>10.1f} "
              f"{row['samples_per_cpu_s']:>14.1f} {row['cpu_ms_per_sample']:>14.1f}  {row['root']}")
    print(f"(load average at the end: {load:.1f} on {os.cpu_count()} cores)")
    if args.out is not None:
        write_json(args.out, {"machine": platform.node(), "cores": os.cpu_count(), "load_average_end": load,
                              "num_workers": 0, "round": args.round, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""LIBERO chunk-step cost with N simulator processes stepping at once (no inference, no Ray).

The simulation side of the eval bound: N real LIBERO envs (one process each, as the env worker
runs them) are built, reset and settled, then step no-op chunks of 16 actions in parallel; the
first (cold) and the following (warm) chunk rounds are timed separately, so a cold first pass on a
fresh machine can be told apart from the steady per-step cost. The simulators step as the env workers
run them: without robosuite's repeated forward pass (``rlinf_cosmos3/sim/repeated_forward.py``);
``--compare-shipped`` then measures the same with robosuite's step as shipped, side by side.

    .venv/bin/python benchmarks/sim_step_cost.py --num-envs 2 --rounds 3         # this box
    python3 benchmarks/sim_step_cost.py --num-envs 16 --rounds 4 --out $OUT/sim.json  # GPU host
    .venv/bin/python benchmarks/sim_step_cost.py --num-envs 1 --rounds 6 --compare-shipped
    .venv/bin/python benchmarks/sim_step_cost.py --num-envs 1 --rounds 4 --with-frames   # the videos' cost
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from rlinf_cosmos3.config.libero_suites import NOOP_ACTION, NUM_SETTLE_STEPS
from rlinf_cosmos3.models.cosmos3.domains import ACTION_HORIZON
from rlinf_cosmos3.sim.client import LiberoSimProcess, recv_all, send_all

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the scripts' shared _common
from _common import write_json  # noqa: E402

logger = logging.getLogger("benchmarks.sim_step_cost")
NOOP = np.asarray(NOOP_ACTION, dtype=np.float64)  # arm still, gripper open


def _timed(procs: list[LiberoSimProcess], cmd: str, **fields: object) -> float:
    """Send ``cmd`` to every process, wait for every reply; the wall time of the round."""
    start = time.monotonic()
    send_all(procs, cmd, **fields)
    recv_all(procs)
    return time.monotonic() - start


def measure(num_envs: int, suite: str, rounds: int, settle_steps: int,
            skip_repeated_forward: bool = True, with_frames: bool = False) -> dict[str, object]:
    """Build ``num_envs`` envs (tasks cycled 0..3), then time make, reset, settle and chunk rounds; with
    ``with_frames`` also the same number of rounds returning every step's frames (an eval that saves videos)."""
    procs = [LiberoSimProcess(name=f"sim{i}") for i in range(num_envs)]
    try:
        out: dict[str, object] = {"num_envs": num_envs, "suite": suite, "machine": platform.node(),
                                  "skip_repeated_forward": skip_repeated_forward}
        start = time.monotonic()
        send_all(procs, "make", per_proc=[{"task_id": i % 4} for i in range(num_envs)], suite=suite,
                 camera_height=256, camera_width=256, seed=0, horizon=1000, hard_reset=True,
                 skip_repeated_forward=skip_repeated_forward)
        recv_all(procs)
        out["make_s"] = time.monotonic() - start
        out["reset_s"] = _timed(procs, "reset", init_state_id=0, privileged=False)
        out["settle_s"] = _timed(procs, "chunk_step", actions=np.tile(NOOP, (settle_steps, 1)))
        chunk = np.tile(NOOP, (ACTION_HORIZON, 1))
        times = [_timed(procs, "chunk_step", actions=chunk) for _ in range(rounds)]
        warm = times[1:] or times
        out["chunk_round_s"] = times
        out["warm_chunk_round_s"] = statistics.median(warm)
        out["warm_env_steps_per_s"] = num_envs * ACTION_HORIZON / statistics.median(warm)
        out["warm_ms_per_env_step"] = 1000.0 * statistics.median(warm) / ACTION_HORIZON
        if with_frames:  # every step renders both cameras and ships them back, as with env.eval.save_video
            framed = [_timed(procs, "chunk_step", actions=chunk, return_frames=True) for _ in range(rounds)]
            out["frames_chunk_round_s"] = framed
            out["frames_warm_ms_per_env_step"] = 1000.0 * statistics.median(framed[1:] or framed) / ACTION_HORIZON
            out["frames_over_last_step_only"] = out["frames_warm_ms_per_env_step"] / out["warm_ms_per_env_step"]
        return out
    finally:
        for proc in procs:
            proc.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, default=2)
    p.add_argument("--suite", default="libero_spatial")
    p.add_argument("--rounds", type=int, default=3, help="timed chunk rounds; the first counts as cold")
    p.add_argument("--settle-steps", type=int, default=NUM_SETTLE_STEPS)
    p.add_argument("--compare-shipped", action="store_true",
                   help="then the same with robosuite's step as shipped (its repeated forward pass not skipped, "
                        "sim/repeated_forward.py): under 'shipped', and the ratio of the two warm steps")
    p.add_argument("--with-frames", action="store_true",
                   help="then as many rounds returning every step's frames (what an eval saving videos asks): "
                        "under 'frames_*', and the ratio to rendering the chunk's last step only")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = measure(args.num_envs, args.suite, args.rounds, args.settle_steps, with_frames=args.with_frames)
    if args.compare_shipped:
        shipped = measure(args.num_envs, args.suite, args.rounds, args.settle_steps, skip_repeated_forward=False)
        result["shipped"] = shipped
        result["shipped_over_skip_ms_per_env_step"] = (
            float(shipped["warm_ms_per_env_step"]) / float(result["warm_ms_per_env_step"]))
    if args.out is not None:
        write_json(args.out, result, indent=1)
    logger.info("%s", json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

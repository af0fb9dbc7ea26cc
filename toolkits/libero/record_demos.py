"""Record scripted LIBERO demonstrations with the real simulator into a LeRobot v3.0 dataset.

    .venv/bin/python toolkits/libero/record_demos.py --suite libero_spatial --task-ids 0 1 \\
        --init-states 5 --out data/libero_demos --repo-id local/libero_demos

``--init-states``: one integer N means the first N of LIBERO's fixed init states (0..N-1); ids are
given as a list (``0 3 7`` or ``0,3,7``) or ranges (``10-19``); a lone id is written ``7,``.
``--task-ids`` takes ids, lists, ranges or ``all``. Episodes that fail are dropped unless
``--keep-failed``; success always comes from the simulator's check_success. ``--camera-storage``
stores the cameras as MP4 videos (``video``, default) or as PNG image features (``image``); the
training reader takes both. See docs/simulator.md.

The dataset appears at ``--out`` only when it is complete: finished episodes collect in ``<out>.partial``
and are joined at the end. An interrupted recording (Ctrl-C, a kill, a crash) is continued by running the
same command again: it keeps the finished episodes and records the rest.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.config.libero_suites import (
    NUM_INIT_STATES,
    NUM_SETTLE_STEPS,
    SUITE_MAX_STEPS,
    SUITE_NUM_TASKS,
)
from rlinf_cosmos3.demos.checks import check_record_config
from rlinf_cosmos3.demos.episode_store import partial_dir
from rlinf_cosmos3.demos.record_config import RECORDED_ACTIONS, default_writer_procs
from rlinf_cosmos3.demos.recorder import (
    CAMERA_STORAGES,
    RecordConfig,
    per_task_summary,
    record_demos,
    success_rate,
)
from rlinf_cosmos3.demos.scripted_policy import ScriptedPolicyConfig
from rlinf_cosmos3.id_lists import parse_id_list

logger = logging.getLogger("record_demos")
NUM_TASKS = SUITE_NUM_TASKS
FLAGS = {"suite": "--suite", "task_ids": "--task-ids", "init_state_ids": "--init-states", "out": "--out",
         "max_steps": "--max-steps", "num_settle_steps": "--settle-steps", "num_envs": "--num-envs",
         "policy.noise_std": "--action-noise", "policy.noise_period": "--noise-period",
         "policy.noise_burst": "--noise-burst", "camera_storage": "--camera-storage",
         "recorded_action": "--recorded-action", "policy.place_jitter": "--place-jitter",
         "policy.approach_jitter": "--approach-jitter", "repeats": "--repeats", "writer_procs": "--writers",
         "concatenate_videos": "--concatenate-videos"}
"""RecordConfig field -> the flag that sets it."""


def _parse_ids(tokens: list[str], what: str) -> list[int]:
    try:
        return parse_id_list(tokens, what)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_init_states(tokens: list[str]) -> list[int]:
    """One plain integer N = the first N init states; anything else = explicit ids (ranges: the recorder's
    checks)."""
    if len(tokens) == 1 and tokens[0].strip().isdigit():
        count = int(tokens[0])
        if not 1 <= count <= NUM_INIT_STATES:
            raise argparse.ArgumentTypeError(f"--init-states: a count must be in 1..{NUM_INIT_STATES} (LIBERO has "
                                             f"{NUM_INIT_STATES} fixed init states per task), got {count}")
        return list(range(count))
    return _parse_ids(tokens, "--init-states")


def parse_task_ids(tokens: list[str], suite: str) -> list[int]:
    if tokens == ["all"]:
        return list(range(NUM_TASKS[suite]))
    return _parse_ids(tokens, "--task-ids")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True, choices=sorted(SUITE_MAX_STEPS))
    p.add_argument("--task-ids", nargs="+", required=True, help="ids, lists (0,1), ranges (0-4) or 'all'")
    p.add_argument("--init-states", nargs="+", default=["1"],
                   help="N = first N init states; or ids: '0 3 7', '0,3,7', '10-19', '7,' (default: 1)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="recorded steps per episode (default: the suite's cap minus the settle steps)")
    p.add_argument("--settle-steps", type=int, default=NUM_SETTLE_STEPS,
                   help="unrecorded no-op steps after each reset (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True,
                   help="dataset root (must not exist or be empty); work in progress is kept in <out>.partial")
    p.add_argument("--repo-id", default="local/libero_demos")
    p.add_argument("--camera-storage", choices=CAMERA_STORAGES, default="video",
                   help="cameras as MP4 videos or as lossless PNG image features (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-failed", action="store_true", help="also keep episodes that did not succeed")
    p.add_argument("--num-envs", type=int, default=1, help="simulator processes stepping in parallel")
    p.add_argument("--writers", type=int, default=None,
                   help="processes writing finished episodes while the simulators go on (default: one per 2 cores)")
    p.add_argument("--action-noise", type=float, default=0.0,
                   help="std of Gaussian noise added to the policy's motion commands (diversity, recoveries)")
    p.add_argument("--noise-period", type=int, default=1,
                   help="commands from the start of one noise burst to the next (default 1: noise on every command)")
    p.add_argument("--noise-burst", type=int, default=1,
                   help="commands per burst that get --action-noise (default 1); e.g. --noise-period 48 "
                        "--noise-burst 4: rare pushes, clean recoveries a 16-step chunk can learn")
    p.add_argument("--recorded-action", choices=RECORDED_ACTIONS, default="executed",
                   help="the action stored per frame: 'executed' (sent to the simulator, noise included) or "
                        "'clean' (the scripted command before --action-noise: DART-style labels)")
    p.add_argument("--place-jitter", type=float, default=0.0,
                   help="metres: carry the object to a random point within this radius of its target, then lower "
                        "diagonally onto the target (demonstrations of getting over and down from beside it)")
    p.add_argument("--approach-jitter", type=float, default=0.0,
                   help="metres: approach a random point within this radius of the point above the grasp, then "
                        "descend diagonally onto the grasp (demonstrations of landing the grasp from off to the side)")
    p.add_argument("--repeats", type=int, default=1,
                   help="episodes per task and init state, each with its own seed (needs --place-jitter, "
                        "--approach-jitter or --action-noise, else they would be identical)")
    p.add_argument("--concatenate-videos", action="store_true",
                   help="pack the videos into large files as lerobot does by default (the join then remuxes once "
                        "per episode, O(n^2)); default: one MP4 per episode and camera, the same frames")
    p.add_argument("--summary-json", type=Path, default=None, help="also write per-task results here")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        task_ids, init_state_ids = parse_task_ids(args.task_ids, args.suite), parse_init_states(args.init_states)
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))  # exit code 2 with the usage, before any simulator starts
    cfg = RecordConfig(
        suite=args.suite,
        task_ids=task_ids,
        init_state_ids=init_state_ids,
        out=args.out,
        repo_id=args.repo_id,
        max_steps=args.max_steps,
        num_settle_steps=args.settle_steps,
        seed=args.seed,
        keep_failed=args.keep_failed,
        num_envs=args.num_envs,
        policy=ScriptedPolicyConfig(noise_std=args.action_noise, noise_period=args.noise_period,
                                    noise_burst=args.noise_burst, place_jitter=args.place_jitter,
                                    approach_jitter=args.approach_jitter),
        repeats=args.repeats,
        writer_procs=args.writers if args.writers is not None else default_writer_procs(),
        camera_storage=args.camera_storage,
        recorded_action=args.recorded_action,
        concatenate_videos=args.concatenate_videos,
    )
    try:  # every input, before a simulator starts or --out is created
        check_record_config(cfg, CAMERA_STORAGES)
    except ConfigError as err:
        fix = f" (fix: {err.fix})" if err.fix else ""
        if err.field in FLAGS:
            parser.error(f"{FLAGS[err.field]}: {err.problem}{fix}")  # exit code 2, with the usage
        print(f"{parser.prog}: error: {err.field}: {err.problem}{fix}", file=sys.stderr)
        return 2
    # Ctrl-C / SIGINT stops the recording and keeps what was saved, also when this was started as a
    # background job (shells start those with SIGINT ignored, and Python then installs no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    timings: dict[str, float] = {}
    try:
        results = record_demos(cfg, show_progress=not args.no_progress, timings=timings)
    except KeyboardInterrupt:
        logger.error("interrupted: simulators stopped; the finished episodes are in %s - run the same command "
                     "again to record the rest", partial_dir(cfg.out))
        return 130
    summary = per_task_summary(results)
    print(f"success rate per task ({cfg.suite}, max {cfg.resolved_max_steps()} recorded steps "
          f"+ {cfg.num_settle_steps} settle steps):")
    for task_id, row in summary.items():
        if row["skipped"]:
            print(f"  task {task_id:2d}: skipped ({row['skipped']})  {row['task']}")
            continue
        print(f"  task {task_id:2d}: {row['successes']}/{row['episodes']} = {row['success_rate']:.0%} "
              f"(mean {row['mean_steps']:.0f} steps, {row['mean_seconds']:.1f}s)  {row['task']}")
    kept = sum(r.episode_index is not None for r in results)
    attempted = sum(r.skipped is None for r in results)
    print(f"overall: {success_rate(results):.0%} of {attempted} attempted episodes; {kept} kept in {cfg.out}")
    if args.summary_json is not None:
        args.summary_json.parent.mkdir(parents=True, exist_ok=True)
        args.summary_json.write_text(json.dumps({"suite": cfg.suite, "per_task": summary, "seconds": timings,
                                                 "num_envs": cfg.num_envs, "writer_procs": cfg.writer_procs,
                                                 "episodes": [vars(r) for r in results]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

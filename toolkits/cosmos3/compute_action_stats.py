"""Compute the quantile_rot action statistics of a LIBERO LeRobot v3 dataset.

    python toolkits/cosmos3/compute_action_stats.py --data DATASET_DIR --out STATS.json
        [--chunk-length 16] [--seed 0] [--max-samples N] [--repo-id local/name] [--episodes 0-39]
        [--gripper-convention zero_one|pm_one|pm_one_flip]

Reads the 7-D ``action`` column (gripper stored as g in [0, 1], 1 = open, by default; ±1 for the
pm_one conventions, see ``rlinf_cosmos3.actions.gripper``) of every episode,
converts it to 10-D ``[dpos, rot6d, gripper]`` and writes ``{"metadata", "global", "global_raw"}``
stats over all training chunks (see ``rlinf_cosmos3.actions.stats`` and
docs/action_conventions.md). If --out is a directory the file is named
``libero_native_frame_wise_relative_rot6d.json`` inside it. Runs offline.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from rlinf_cosmos3.actions.gripper import GRIPPER_CONVENTIONS
from rlinf_cosmos3.actions.stats import (
    DEFAULT_CHUNK_LENGTH,
    STATS_FILENAME,
    compute_action_stats,
    read_lerobot_episode_actions,
    write_action_stats,
)
from rlinf_cosmos3.id_lists import parse_id_list

logger = logging.getLogger("compute_action_stats")
DATA_FIX = ("give the root of a LIBERO LeRobot v3 dataset (meta/info.json, a 7-D 'action' column with the gripper "
            "stored in [0, 1]), e.g. one written by toolkits/libero/record_demos.py")


def _fail(problem: str, fix: str) -> int:
    """Exit code 2 after one line naming the input and the fix; nothing is written."""
    logger.error("error: %s (fix: %s)", problem, fix)
    return 2


def _span(ids: list[int]) -> str:
    return f"{min(ids)}..{max(ids)}" if ids else "(none)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, required=True, help="LeRobot v3 dataset root (has meta/info.json)"
    )
    parser.add_argument("--out", type=Path, required=True, help="stats JSON file to write (or a directory)")
    parser.add_argument("--chunk-length", type=int, default=DEFAULT_CHUNK_LENGTH, help="actions per chunk")
    parser.add_argument("--seed", type=int, default=0, help="seed of the chunk subset (with --max-samples)")
    parser.add_argument(
        "--max-samples", type=int, default=None, help="use a random subset of this many chunks (default: all)"
    )
    parser.add_argument(
        "--repo-id", default=None, help="repo id to open the dataset with (default: local/<dir>)"
    )
    parser.add_argument(
        "--episodes", nargs="+", default=None,
        help="only these episode indexes, as training reads them (data.dataset.episodes): ids or ranges, "
             "e.g. '0-39' or '0 2 5' (default: all)",
    )
    parser.add_argument(
        "--gripper-convention", choices=GRIPPER_CONVENTIONS, default="zero_one",
        help="how the dataset stores the gripper: zero_one (g in [0, 1], 1 = open; ours and NVIDIA's), "
             "pm_one (-1 open / +1 close, the community lerobot/libero_* sets) or pm_one_flip (signs inverted); "
             "recorded in the metadata, training and evaluation must declare the same",
    )
    args = parser.parse_args(argv)
    if args.chunk_length < 1:  # before the dataset is opened
        parser.error(f"--chunk-length: must be >= 1, got {args.chunk_length} (fix: the model's action horizon, "
                     f"{DEFAULT_CHUNK_LENGTH} for Cosmos3)")
    if args.max_samples is not None and args.max_samples < 1:
        parser.error(f"--max-samples: must be >= 1, got {args.max_samples} (fix: leave it out to use every chunk)")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    # Never reach for the Hugging Face hub: a missing file must be an error, not a download.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    try:
        data = read_lerobot_episode_actions(args.data, repo_id=args.repo_id)
    except (FileNotFoundError, ValueError) as exc:
        return _fail(f"--data: {exc}", DATA_FIX)
    episodes = data.episodes
    if args.episodes is not None:
        try:
            wanted = set(parse_id_list(args.episodes, "--episodes"))
        except ValueError as exc:
            return _fail(str(exc), "give ids or ranges such as 0-39 or 0 2 5")
        missing = sorted(wanted - set(data.episode_indices))
        if missing:
            return _fail(f"--episodes {missing} are not in the dataset ({len(data.episodes)} episodes)",
                         f"choose among the dataset's episode indexes {_span(data.episode_indices)}")
        episodes = [ep for i, ep in zip(data.episode_indices, data.episodes, strict=True) if i in wanted]
    try:
        stats = compute_action_stats(
            episodes,
            chunk_length=args.chunk_length,
            max_samples=args.max_samples,
            seed=args.seed,
            gripper_convention=args.gripper_convention,
            metadata={"fps": data.fps, "dataset_root": str(data.root), "repo_id": data.repo_id},
        )
    except ValueError as exc:  # the actions themselves (gripper convention, NaN, episodes shorter than a chunk)
        return _fail(f"--data: {exc}", DATA_FIX)
    out = args.out / STATS_FILENAME if args.out.is_dir() else args.out
    write_action_stats(stats, out)

    meta = stats["metadata"]
    logger.info(
        "read %s: %d episodes, %d frames at %d fps",
        data.root,
        meta["num_episodes"],
        meta["num_frames"],
        data.fps,
    )
    logger.info(
        "used %d of %d chunks of %d actions (%d action rows), seed %d",
        meta["num_chunks"],
        meta["num_chunks_available"],
        meta["chunk_length"],
        meta["num_rows_stats"],
        meta["seed"],
    )
    for field in ("q01", "q99", "mean", "std"):
        logger.info("global_raw.%-4s %s", field, " ".join(f"{v:+.4f}" for v in stats["global_raw"][field]))
    logger.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

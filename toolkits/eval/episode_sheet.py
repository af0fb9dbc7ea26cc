"""One picture of many evaluated episodes: a row per episode, a frame every N steps of its video.

    .venv/bin/python toolkits/eval/episode_sheet.py logs/<eval run> [logs/<another run> ...] \\
        --select failures --every 30 --out failures.jpg

Why: a researcher asking *where* a policy fails wants to see every failure at a glance, not open 20
mp4s one by one (and from a GPU machine only a few files come back). Each row is labelled with the
run, task, init state, outcome and length; its frames are the eval videos' own (the policy's main and
wrist views side by side), at steps 0, N, 2N, ... and the episode's last step. Rows go run by run,
by task and init state within a run; episodes without a video (``env.eval.save_video`` was ``none``, or
``failures`` for a success) are counted and left out.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from rlinf_cosmos3.id_lists import parse_id_list
from rlinf_cosmos3.sim.object_lift import lift_label
from rlinf_cosmos3.tracking.results_file import episode_video, read_results

SELECTIONS = ("failures", "successes", "all")
LABEL_WIDTH = 210
BACKGROUND = (255, 255, 255)


@dataclass(frozen=True)
class Episode:
    """One row of the sheet: where its video is and what to write beside it."""

    video: Path
    label: str


def select_episodes(runs: list[str], select: str, init_states: set[int] | None) -> tuple[list[Episode], int]:
    """The episodes of ``runs`` to draw and how many matched but had no video."""
    episodes, without_video = [], 0
    for run in runs:
        run_dir = Path(run)
        rows = sorted(read_results(run_dir, init_states), key=lambda r: (int(r["task_id"]), int(r["trial_id"])))
        for row in rows:
            success = bool(row["success_once"])
            if (select == "failures" and success) or (select == "successes" and not success):
                continue
            video = episode_video(run_dir, row)
            if video is None:
                without_video += 1
                continue
            outcome = "success" if success else ("error" if row.get("error") else "failure")
            lifted = lift_label(row.get("object_lift_m"))
            episodes.append(Episode(video, f"{run_dir.name[:26]}\ntask {row['task_id']}  init {row['trial_id']}\n"
                                           f"{outcome}, {row.get('steps', '?')} steps" + (f"\n{lifted}" if lifted else "")))
    return episodes, without_video


def sampled_frames(video: Path, every: int, height: int) -> list[np.ndarray]:
    """Frames 0, every, 2*every, ... and the last of ``video``, each resized to ``height`` rows."""
    import av

    if not video.is_file():
        raise FileNotFoundError(f"video {video} listed in results.jsonl is missing (moved or deleted run files?)")
    kept: list[Image.Image] = []
    last: Image.Image | None = None
    with av.open(str(video)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            last = frame.to_image()
            if index % every == 0:
                kept.append(last)
                last = None
    if last is not None:  # the final step, when it does not fall on the grid
        kept.append(last)
    if not kept:
        raise ValueError(f"video {video} has no frames")
    width = round(kept[0].width * height / kept[0].height)
    return [np.asarray(img.convert("RGB").resize((width, height), Image.BILINEAR)) for img in kept]


def sheet(episodes: list[Episode], every: int, height: int) -> Image.Image:
    """The rows stacked: label, then the sampled frames, white where a row is shorter."""
    rows = [(ep.label, sampled_frames(ep.video, every, height)) for ep in episodes]
    frame_width = max(frames[0].shape[1] for _, frames in rows)
    columns = max(len(frames) for _, frames in rows)
    image = Image.new("RGB", (LABEL_WIDTH + columns * (frame_width + 2), len(rows) * (height + 4)), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for number, (label, frames) in enumerate(rows):
        top = number * (height + 4)
        draw.multiline_text((6, top + 6), label, fill=(0, 0, 0), spacing=4)
        for column, frame in enumerate(frames):
            image.paste(Image.fromarray(frame), (LABEL_WIDTH + column * (frame_width + 2), top))
    return image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="eval run directories (logs/<timestamp>-<config>)")
    parser.add_argument("--select", choices=SELECTIONS, default="failures")
    parser.add_argument("--init-states", help="only these init states, e.g. 0-39 or 2,8,24")
    parser.add_argument("--every", type=int, default=30, help="a frame every this many steps (default 30)")
    parser.add_argument("--frame-height", type=int, default=96, help="pixel rows per frame (default 96)")
    parser.add_argument("--max-episodes", type=int, default=60, help="at most this many rows (default 60)")
    parser.add_argument("--out", type=Path, required=True, help="image to write (.jpg or .png)")
    args = parser.parse_args(argv)
    checks: list[tuple[bool, str]] = [
        (args.every >= 1, f"--every: {args.every} must be >= 1"),
        (16 <= args.frame_height <= 512, f"--frame-height: {args.frame_height} must be 16..512"),
        (args.max_episodes >= 1, f"--max-episodes: {args.max_episodes} must be >= 1"),
        (args.out.suffix.lower() in (".jpg", ".jpeg", ".png"), f"--out: {args.out} must end in .jpg or .png"),
    ]
    for ok, message in checks:
        if not ok:
            print(f"error: {message}", file=sys.stderr)
            return 2
    try:
        states = set(parse_id_list([args.init_states], "init states")) if args.init_states else None
        episodes, without_video = select_episodes(args.runs, args.select, states)
        if not episodes:
            raise ValueError(f"no {args.select} with a video in {', '.join(args.runs)}"
                             + (f" ({without_video} without one: evaluate with env.eval.save_video=all "
                                "or failures)" if without_video else ""))
        image = sheet(episodes[: args.max_episodes], args.every, args.frame_height)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {"quality": 85} if args.out.suffix.lower() in (".jpg", ".jpeg") else {}
    image.save(args.out, **options)
    dropped = max(0, len(episodes) - args.max_episodes)
    print(f"wrote {args.out}: {min(len(episodes), args.max_episodes)} {args.select}, {image.width}x{image.height} px"
          + (f"; {dropped} more left out (--max-episodes)" if dropped else "")
          + (f"; {without_video} without a video" if without_video else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

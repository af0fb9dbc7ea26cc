"""Training curves of an SFT run as a picture: loss, action loss, learning rate and grad norm vs step.

    .venv/bin/python toolkits/plot_training.py logs/<timestamp>-<config> [MORE_RUNS ...] [--out curves.png]

Reads the run's TensorBoard events (``<run>/tensorboard``, the ``train/*`` scalars the SFT driver
writes) and draws a 2 x 2 figure (default: ``<first run>/training_curves.png``). A training resumed
with ``runner.resume_dir`` logs into a run directory of its own: give them all, in order, and the
curves join into one (where steps overlap, the later run's values are drawn).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PANELS = (("train/loss", "loss", True), ("train/action_loss", "action loss", True),
          ("train/lr", "learning rate", False), ("train/grad_norm", "grad norm (before clipping)", True))


def read_scalars(run_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """Every ``train/*`` scalar of a run as (steps, values)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory '{run_dir}' (give the logs/<timestamp>-<config> directory the "
                                "SFT launcher printed)")
    events_dir = run_dir / "tensorboard" if (run_dir / "tensorboard").is_dir() else run_dir
    acc = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: ([e.step for e in acc.Scalars(tag)], [e.value for e in acc.Scalars(tag)])
            for tag in acc.Tags()["scalars"]}


def joined_scalars(run_dirs: list[Path]) -> dict[str, tuple[list[int], list[float]]]:
    """The ``train/*`` scalars of runs that continue one another, by step (later runs win on overlap)."""
    by_tag: dict[str, dict[int, float]] = {}
    for run_dir in run_dirs:
        scalars = read_scalars(run_dir)
        if "train/loss" not in scalars:
            raise ValueError(f"no train/loss scalars in {run_dir} (not an SFT run directory?); give the "
                             "logs/<timestamp>-<config> directory the SFT launcher printed")
        for tag, (steps, values) in scalars.items():
            by_tag.setdefault(tag, {}).update(zip(steps, values, strict=True))
    return {tag: (sorted(points), [points[step] for step in sorted(points)]) for tag, points in by_tag.items()}


def plot(run_dirs: list[Path], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scalars = joined_scalars(run_dirs)
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True)
    for ax, (tag, title, log_y) in zip(axes.flat, PANELS, strict=True):
        steps, values = scalars.get(tag, ([], []))
        ax.plot(steps, values, linewidth=1.0)
        if tag == "train/loss" and "train/vision_loss" in scalars:
            ax.plot(*scalars["train/vision_loss"], linewidth=0.8, alpha=0.7, label="vision")
            ax.legend(["total", "vision (unscaled)"], fontsize=8)
        ax.set_title(title, fontsize=10)
        if log_y and values and min(values) > 0:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    return save_figure(fig, run_dirs, out)


def save_figure(fig: Any, run_dirs: list[Path], out: Path) -> Path:
    """Title the figure with the runs it draws, write it as ``out`` (PNG) and free it."""
    import matplotlib.pyplot as plt

    fig.suptitle(" + ".join(run_dir.name for run_dir in run_dirs), fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_cli(argv: list[str] | None, doc: str | None, plot_runs: Callable[[list[Path], Path], Path], kind: str,
            default_name: str) -> int:
    """The command line of a curves tool: run directories in (a run and its resumptions), one PNG out, exit 2 with
    the reason on a directory it cannot read."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", type=Path, nargs="+", metavar="run_dir",
                        help=f"{kind} run directory (logs/<timestamp>-<config>); several: a run and its resumptions, "
                        "in order")
    parser.add_argument("--out", type=Path, help=f"PNG to write (default: <first run_dir>/{default_name})")
    args = parser.parse_args(argv)
    try:
        out = plot_runs(args.run_dirs, args.out or args.run_dirs[0] / default_name)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, __doc__, plot, "SFT", "training_curves.png")


if __name__ == "__main__":
    sys.exit(main())

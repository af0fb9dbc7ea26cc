"""An RL run as a picture: success against the episodes played, and the update's health against the iteration.

    .venv/bin/python toolkits/plot_rl.py logs/<timestamp>-<config> [MORE_RUNS ...] [--out rl_curves.png]

Reads the run's TensorBoard events (``<run>/tensorboard``: the ``rl/*`` scalars ``examples/rl/run_vla_rl.sh``
writes each iteration, and ``eval/*`` where ``runner.eval_interval`` evaluated checkpoints) and draws 2 x 2
panels (default: ``<first run>/rl_curves.png``):

- success against episodes: the rollouts' success rate per iteration (the stochastic sampler on the starts it
  trains on) and, where online evaluations ran, their ``success_once`` (the deterministic eval protocol);
- the episode length against episodes;
- approx KL and clip fraction against the iteration;
- the advantage's std and the gradient norm against the iteration.

A run resumed with ``runner.resume_dir`` logs into a run directory of its own: give them all, in order, and the
curves join (where iterations overlap, the later run's values are drawn).
"""

from __future__ import annotations

import sys
from pathlib import Path

from plot_training import read_scalars, run_cli, save_figure

Series = tuple[list[int], list[float]]


def joined_rl_scalars(run_dirs: list[Path]) -> dict[str, Series]:
    """The ``rl/*`` and ``eval/*`` scalars of runs that continue one another, by iteration (later runs win)."""
    by_tag: dict[str, dict[int, float]] = {}
    for run_dir in run_dirs:
        scalars = read_scalars(run_dir)
        if "rl/success_rate" not in scalars:
            raise ValueError(f"no rl/success_rate scalars in {run_dir} (not an RL run directory?); give the "
                             "logs/<timestamp>-<config> directory that run_vla_rl.sh printed")
        for tag, (steps, values) in scalars.items():
            if tag.startswith(("rl/", "eval/")):
                by_tag.setdefault(tag, {}).update(zip(steps, values, strict=True))
    return {tag: (sorted(points), [points[step] for step in sorted(points)]) for tag, points in by_tag.items()}


def success_vs_episodes(scalars: dict[str, Series]) -> dict[str, Series]:
    """``rollout`` (and ``eval`` where evaluated): x = episodes played by the end of that iteration, y = success."""
    iterations, totals = scalars["rl/episodes_total"]
    episodes_at = dict(zip(iterations, totals, strict=True))
    out = {"rollout": ([int(episodes_at[i]) for i in scalars["rl/success_rate"][0]], scalars["rl/success_rate"][1])}
    if "eval/success_once" in scalars:
        steps, rates = scalars["eval/success_once"]
        kept = [(int(episodes_at[s]), r) for s, r in zip(steps, rates, strict=True) if s in episodes_at]
        out["eval"] = ([e for e, _ in kept], [r for _, r in kept])
    return out


def plot(run_dirs: list[Path], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scalars = joined_rl_scalars(run_dirs)
    curves = success_vs_episodes(scalars)
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    ax = axes[0, 0]
    ax.plot(*curves["rollout"], marker=".", linewidth=1.0, label="rollouts (stochastic, training starts)")
    if "eval" in curves:
        ax.plot(*curves["eval"], marker="o", linewidth=1.2, label="online eval (deterministic)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("episodes played")
    ax.set_title("success", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    ax.plot(curves["rollout"][0], scalars["rl/episode_length"][1], marker=".", linewidth=1.0)
    ax.set_xlabel("episodes played")
    ax.set_title("episode length (policy steps)", fontsize=10)
    for ax, tags, title in ((axes[1, 0], ("rl/approx_kl", "rl/clip_fraction"), "approx KL, clip fraction"),
                            (axes[1, 1], ("rl/advantage_std", "rl/grad_norm"), "advantage std, grad norm")):
        for tag in tags:
            if tag in scalars:
                ax.plot(*scalars[tag], marker=".", linewidth=1.0, label=tag.removeprefix("rl/"))
        ax.set_xlabel("iteration")
        ax.set_title(title, fontsize=10)
        if ax.lines:  # an iteration without a group that has signal takes no update step: nothing to draw
            ax.legend(fontsize=8)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    return save_figure(fig, run_dirs, out)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, __doc__, plot, "RL", "rl_curves.png")


if __name__ == "__main__":
    sys.exit(main())

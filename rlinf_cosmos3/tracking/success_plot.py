"""``success.png``: per-task success bars with their Wilson 95 % intervals - what people look at first.

Drawn with matplotlib's file-only Agg backend (no display needed), one horizontal bar per task plus
the pooled rate, each labelled with its counts, so a reader sees at a glance which tasks fail and how
uncertain each rate is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlinf_cosmos3.tracking.success import SuccessRate, overall


def plot_success(rates: Mapping[str, SuccessRate], path: str | Path, title: str) -> Path:
    """Write the bar chart of ``rates`` (label -> rate, drawn top to bottom, then "all") to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rates:
        raise ValueError("no success rates to plot")
    labels = [*rates, "all"]
    values = [*rates.values(), overall(rates.values())]
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.42 * len(labels)))
    ys = list(range(len(labels)))[::-1]
    for y, label, rate in zip(ys, labels, values, strict=True):
        low, high = rate.ci95
        ax.barh(y, rate.rate * 100, color="#4c72b0" if label != "all" else "#55a868", height=0.6)
        # max(0, .): at 0 % or 100 % the Wilson bound equals the rate only up to rounding (10/10 gives
        # 1 - 1.1e-16), and matplotlib refuses a negative error bar
        below, above = max(0.0, rate.rate - low) * 100, max(0.0, high - rate.rate) * 100
        ax.errorbar(rate.rate * 100, y, xerr=[[below], [above]],
                    fmt="none", ecolor="black", capsize=3, linewidth=1)
        ax.text(101, y, f"{rate.rate:.0%} ({rate.successes}/{rate.trials})", va="center", fontsize=8)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlim(0, 128)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("success (%), bars: Wilson 95 % interval")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

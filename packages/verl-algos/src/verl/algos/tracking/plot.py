"""A PNG of a run's main curves, written at the end of training from ``metrics.jsonl``."""

from __future__ import annotations

import os

from verl.algos.tracking.file import read_metrics

PANELS = (
    ("critic/score/mean", "train score (mean)"),
    ("val/acc", "validation accuracy"),
    ("response_length/mean", "response length (tokens)"),
    ("actor/pg_loss", "policy loss"),
    ("actor/entropy", "entropy"),
    ("timing_s/step", "step time (s)"),
)


def plot_curves(local_dir: str, out_name: str = "curves.png") -> str | None:
    """Write ``<local_dir>/curves.png``; returns its path, or None when there is nothing to plot."""
    records = read_metrics(local_dir)
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, title) in zip(axes.flat, PANELS):
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(local_dir, out_name)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

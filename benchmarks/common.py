"""What every benchmark shares: the output folder, markdown tables (printed and written), JSON records,
plots, and a note of the machine and its load (these machines are shared: read ratios, not seconds)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any


def base_parser(description: str, default_out: str = "bench_out") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=default_out, help="folder for the tables, JSON records and plots")
    return parser


def runs_folder(out: str | Path, kind: str) -> Path:
    """A fresh folder for this invocation's training runs: ``<out>/<kind>/<date-time>``. Runs of an earlier
    invocation into the same ``--out`` stay where they are and are never read back: ``verl train`` appends
    its metrics to its folder's (and would resume from checkpoints there), so reusing a folder mixed the
    older run's records into the newer table."""
    folder = Path(out) / kind / time.strftime("%Y%m%d-%H%M%S")
    suffix = 1
    while folder.exists():
        folder = folder.with_name(f"{folder.name.split('.')[0]}.{suffix}")
        suffix += 1
    return folder


def machine_note() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    import torch

    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report(out: str | Path, name: str, title: str, table: str, records: Any, notes: Sequence[str] = ()) -> Path:
    """Print ``table`` under ``title`` and write ``<name>.md`` and ``<name>.json`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join([f"## {title}", "", table, "", *[f"- {n}" for n in notes], f"- machine: {machine_note()}", ""])
    print(text, flush=True)
    (out / f"{name}.md").write_text(text)
    plain = [asdict(r) if is_dataclass(r) else r for r in records] if isinstance(records, list) else records
    (out / f"{name}.json").write_text(json.dumps(plain, indent=1, default=str))
    return out / f"{name}.md"


def save_plot(fig, out: str | Path, name: str) -> Path:
    path = Path(out) / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}", flush=True)
    return path


def plot_accuracy_over_time(runs, out: str | Path, name: str, title: str, target: float | None = None) -> Path:
    """Held-out accuracy against cumulative training time, one line per run (``runners.RunResult``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in runs:
        ax.plot([e["train_s"] for e in r.evals], [e["val_acc"] for e in r.evals], marker="o", label=r.label)
    if target is not None:
        ax.axhline(target, color="#999", linestyle=":", label="TRL final")
    ax.set_xlabel("training wall time (s), validation excluded")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title)
    ax.legend()
    return save_plot(fig, out, name)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")

"""One report figure: a matplotlib Figure on its own Agg canvas, its title and its PNG.

Figures are built on matplotlib.figure.Figure with an explicit Agg canvas instead of pyplot:
no global backend switch, no display needed, and no figure left open in a long-lived process.
Shared by plots.py (scaling) and plots_time.py (where the time goes), which import only this.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIGSIZE = (6.0, 4.0)
DPI = 110


def title(summary: pd.DataFrame, what: str) -> str:
    # Simulated numbers must never be mistaken for GPU results, even when a
    # figure is copied out of the report on its own.
    if bool(summary["simulated"].any()):
        return f"{what} (CPU-simulated devices)"
    return what


def new_axes():
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.4)
    ax.set_axisbelow(True)
    return fig, ax


def save(fig: Figure, path: str | Path) -> None:
    fig.tight_layout()
    # format given explicitly so callers may write to a temp name first.
    fig.savefig(path, format="png", dpi=DPI)

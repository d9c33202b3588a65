"""One matplotlib style for every otbound figure: labelled axes, legends, paper column width.

``figure(ncols=1)`` sets the style and gives a figure sized for a paper column (3.4 in wide per panel, 8-pt text);
``save(fig, path_without_suffix, formats=("png", "pdf"))`` writes each format and closes it.

Importing this module leaves matplotlib's backend as the user has it (inline in Jupyter, a window in
a desktop session, Agg where there is no display): figures drawn with :func:`figure` show where the
user's figures show. Command lines that only write files choose Agg themselves (:func:`use_file_backend`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from otbound._io import atomic_path

STYLE = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "axes.spines.top": False,
    "axes.spines.right": False,
}
COLUMN_WIDTH_IN = 3.4


def use_file_backend() -> None:
    """Switch matplotlib to Agg, for a command line that writes figures to files and shows none.

    Called by the command lines (``python -m otbound.compare``, the figure scripts), never on import,
    so a notebook or an interactive session keeps its own backend.
    """
    matplotlib.use("Agg")


def figure(ncols: int = 1, nrows: int = 1, height: float = 2.4, **kwargs):
    """A (fig, axes) pair in the otbound style, ``ncols`` column-width panels side by side."""
    plt.rcParams.update(STYLE)  # artists read rcParams when drawn, so the style is set, not scoped
    fig, axes = plt.subplots(nrows, ncols, figsize=(COLUMN_WIDTH_IN * ncols, height * nrows), squeeze=False, **kwargs)
    fig.set_layout_engine("constrained")
    return fig, axes


def save(fig, path, formats=("png",)) -> list[Path]:
    """Write ``fig`` as ``path.<fmt>`` for each format, close it, return the paths.

    PDFs are written without a creation date, so regenerating a figure from the same results gives
    the same bytes (no spurious changes to committed figures)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in formats:
        target = path.with_suffix(f".{fmt}")
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=fmt, metadata={"CreationDate": None} if fmt == "pdf" else None)
        out.append(target)
    plt.close(fig)
    return out

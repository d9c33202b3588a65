"""One matplotlib style for every otbound figure: labelled axes, legends, paper column width.

``figure(ncols=1)`` sets the style and gives a figure sized for a paper column (3.4 in wide per panel, 8-pt text);
``save(fig, path_without_suffix, formats=("png", "pdf"))`` writes each format and closes it.

One colour per name everywhere (:func:`color`: every draft law and every verifier of the registries has
its own, the same in every panel and figure; datasets are told apart by marker, :func:`marker`), integer
K ticks (:func:`integer_ticks`) and direct labels at the end of lines instead of long legends
(:func:`label_ends`).

Importing this module leaves matplotlib's backend as the user has it (inline in Jupyter, a window in
a desktop session, Agg where there is no display): figures drawn with :func:`figure` show where the
user's figures show. Command lines that only write files choose Agg themselves (:func:`use_file_backend`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import matplotlib.transforms

from otbound._io import atomic_path
from otbound.token.draft_laws import DRAFT_LAWS

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

#: the colour of each draft law and each verifier, the same in every otbound figure (a verifier's hue
#: family follows its law: blues with replacement, oranges/reds without, greens greedy, greys deterministic)
COLORS = {
    # draft laws: each law's own (:attr:`otbound.token.DraftLaw.color`)
    **{name: law.color for name, law in DRAFT_LAWS.items()},
    # token-level verifiers, by law
    "nss": "#6baed6", "rrs": "#1f77b4", "kseq": "#17becf", "khisti_is": "#9467bd", "khisti_lp": "#54278f",
    "ot": "#08306b", "gls": "#4a1486",
    "rrs_wor": "#ff7f0e", "ot_wor_top": "#e377c2", "ot_wor_iid": "#8c564b", "ot_wor": "#d62728",
    "spechub": "#bcbd22",  # the greedy verifier shares its law's name and colour
    "onehot": "#969696", "nss_deterministic": "#525252",
    # block-level verifiers (shown beside the token-level ones in the end-to-end figure: colours of their own)
    "token": "#a6761d", "block": "#e7298a", "multipath_rrs": "#66a61e", "multipath_kseq": "#7570b3",
    "traversal": "#1b9e77", "spectr_gbv": "#d95f02", "causal_optimal": "#000000", "hsd": "#a65628",
    "univer": "#e6ab02", "static_tree": "#666666",
}
#: line style and marker of each draft law where several laws share a panel
LAW_STYLES = {name: law.style for name, law in DRAFT_LAWS.items()}
_MARKERS = ("o", "s", "^", "D", "v", "P")


def color(name: str) -> str:
    """The colour of a draft law or verifier (:data:`COLORS`); another name gets a fixed colour of
    matplotlib's tab10 cycle chosen from its characters, the same in every run.

    Examples
    --------
    >>> color("rrs"), color("rrs") == color("rrs")
    ('#1f77b4', True)
    """
    if name in COLORS:
        return COLORS[name]
    return f"C{sum(map(ord, name)) % 10}"


def marker(i: int) -> str:
    """The marker of the ``i``-th dataset of a figure (filled circle, square, triangle, ...)."""
    return _MARKERS[i % len(_MARKERS)]


def integer_ticks(ax, values) -> None:
    """Ticks on the x axis at the integers ``values`` only (e.g. K), never at 2.25."""
    values = sorted({int(v) for v in values})
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def label_ends(ax, items, *, min_gap: float = 0.075, fontsize: float = 6.5) -> list:
    """Direct labels in the right margin of ``ax``: each ``(text, y, colour)`` is written at height
    ``y`` (data units) beside the axes, moved apart by at least ``min_gap`` of the axes' height so
    no two overlap. Call after the y limits are final. Returns the Text artists.
    """
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi)  # fixed: the labels are placed against these limits
    span = (hi - lo) or 1.0
    placed = sorted(((min(max((y - lo) / span, 0.0), 1.0), t, c) for t, y, c in items), key=lambda e: e[0])
    ys = [e[0] for e in placed]
    for i in range(1, len(ys)):  # push up from the bottom, then pull down from the top
        ys[i] = max(ys[i], ys[i - 1] + min_gap)
    overflow = ys[-1] - 1.0 if ys else 0.0
    if overflow > 0:
        ys[-1] -= overflow
        for i in range(len(ys) - 2, -1, -1):
            ys[i] = min(ys[i], ys[i + 1] - min_gap)
    transform = matplotlib.transforms.blended_transform_factory(ax.transAxes, ax.transAxes)
    return [ax.text(1.02, y, t, color=c, transform=transform, va="center", ha="left", fontsize=fontsize,
                    clip_on=False) for y, (_, t, c) in zip(ys, placed)]


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

"""The notebooks run top to bottom offline (nbclient, kernel python3) and are stored without outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["01_quickstart", "02_verifiers_on_real_traces", "03_block_bounds", "05_check_your_verifier"]
#: per-notebook execution limit (each is designed to finish in well under a minute on 2 cores)
TIMEOUT_S = 180


def test_every_notebook_is_listed():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    raw = (NOTEBOOKS / f"{name}.ipynb").read_text()
    assert "output_type" not in raw, f"{name}.ipynb is stored with outputs; strip them"
    nb = json.loads(raw)
    codes = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert codes, f"{name}.ipynb has no code cells"
    assert all(c["execution_count"] is None and c["outputs"] == [] for c in codes)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("name", NAMES)
def test_runs_top_to_bottom(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    # every code cell ran, in order
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))

"""The notebooks run top to bottom offline (nbclient, kernel python3), draw their figures (PNG outputs,
as Jupyter shows them), print no solver banner, and are stored without outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["01_quickstart", "02_verifiers_on_real_traces", "03_block_bounds", "04_end_to_end", "05_check_your_verifier"]
#: per-notebook execution limit (each is designed to finish in well under a minute on 2 cores)
TIMEOUT_S = 180
#: the notebooks that draw, and how many figures each shows (one PNG output per figure)
FIGURES = {"01_quickstart": 1, "02_verifiers_on_real_traces": 1, "03_block_bounds": 1, "04_end_to_end": 1}


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
    # the kernel captures output at the file-descriptor level (what C code such as a solver prints) as
    # in Jupyter, which ipykernel turns off when it sees pytest's variable
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    client.execute(env=env)  # raises CellExecutionError naming the failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    # every code cell ran, in order
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    # the figures show as images (a notebook whose backend was switched away from inline prints
    # "<Figure size ...>" text instead), each once
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == FIGURES.get(name, 0), f"{name}: {len(images)} PNG outputs"
    as_text = [o for o in outputs if "image/png" not in o.get("data", {"image/png": 0})]
    assert not [o for o in as_text if "<Figure size" in o["data"].get("text/plain", "")], f"{name}: a figure as text"
    texts = [o.get("text", "") for o in outputs if o.output_type == "stream"]
    assert not [t for t in texts if "Running HiGHS" in t], f"{name} prints the HiGHS banner"


def test_import_keeps_the_backend():
    """Importing the plotting module (and the package) leaves matplotlib's backend as it was."""
    import subprocess
    import sys

    code = (
        "import matplotlib; matplotlib.use('svg'); import otbound, otbound.report.plots, otbound.report; "
        "import matplotlib.pyplot as plt; print(matplotlib.get_backend())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "svg"

"""Sphinx configuration of the otbound documentation.

Markdown pages (MyST) in ``guide/``, ``theory/`` and ``results/`` are picked up by glob toctrees.
The API reference is generated at build time from each public package's ``__all__`` (see
:func:`write_api_pages`), so a name added to or removed from ``__all__`` appears in or leaves the
reference without editing the docs. Build: ``python -m sphinx -W --keep-going -b html docs
docs/_build/html`` (``tests/test_docs.py`` runs exactly that).

Warnings policy: the build runs with ``-W``. Cross-references are checked (``nitpicky``) for the
project's own names: a ``:func:`otbound...``` that does not resolve fails the build; references to
other libraries' names (numpy, torch, builtins) are not checked, since no intersphinx inventory is
reachable offline.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

project = "otbound"
author = "the otbound authors"
copyright = "2026, the otbound authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 bundled into _static: the math renders without a network
    "sphinx.ext.viewcode",
    "numpydoc",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]

# MyST: $...$ / $$...$$ math, ::: fences, (label)= targets, heading anchors for [](page.md#anchor)
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# autodoc / autosummary / numpydoc
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "none"  # numpydoc's Parameters section carries the types
autodoc_preserve_defaults = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = False
numpydoc_xref_param_type = False

# Cross-references: every unresolved reference to an otbound name is an error; names of other
# libraries are not resolvable offline and are not checked.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"^(?!otbound\b).*")]

html_theme = "pydata_sphinx_theme"
html_title = "otbound"
html_static_path = ["_static"]
html_css_files = ["otbound.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "footer_start": ["copyright"],
    "footer_end": [],
}

#: The public packages documented in the API reference, in reading order.
API_PACKAGES = [
    "otbound",
    "otbound.token",
    "otbound.token.verifiers",
    "otbound.block",
    "otbound.block.verifiers",
    "otbound.objectives",
    "otbound.lm",
    "otbound.report",
    "otbound.conformance",
    "otbound.engine",
]


def _canonical_homes(packages: list[str]) -> dict[int, tuple[str, str]]:
    """Each public object documented once: ``id(obj) -> (package, name)``, the deepest listed package
    whose ``__all__`` has it, under its own ``__name__`` where a package exports it by that name."""
    home: dict[int, tuple[str, str]] = {}
    for name in sorted(packages, key=lambda n: n.count(".")):
        mod = importlib.import_module(name)
        for member in getattr(mod, "__all__", []):
            obj = getattr(mod, member)
            if inspect.ismodule(obj):
                continue
            own_name = getattr(obj, "__name__", member) == member
            old = home.get(id(obj))
            if old is None or own_name or getattr(obj, "__name__", old[1]) != old[1]:
                home[id(obj)] = (name, member)  # deeper packages come later and win
    return home


def write_api_pages(app=None) -> None:
    """Write ``api/<package>.rst`` from each package's ``__all__`` (modules are linked, objects are
    documented on one page per object in their canonical package and listed elsewhere)."""
    out = HERE / "api"
    out.mkdir(exist_ok=True)
    # the per-object pages are regenerated on every build: a name no longer exported leaves none behind
    shutil.rmtree(out / "generated", ignore_errors=True)
    home = _canonical_homes(API_PACKAGES)
    for name in API_PACKAGES:
        mod = importlib.import_module(name)
        own, elsewhere, submodules = [], [], []
        for member in mod.__all__:
            obj = getattr(mod, member)
            if inspect.ismodule(obj):
                submodules.append(obj.__name__)
            elif home[id(obj)] == (name, member):
                own.append(member)
            else:
                alias = f" (as ``{member}``)" if home[id(obj)][1] != member else ""
                elsewhere.append(".".join(home[id(obj)]) + alias)
        lines = [name, "=" * len(name), "", f".. automodule:: {name}", "   :no-members:", ""]
        lines += [f".. currentmodule:: {name}", ""]
        if own:
            lines += [".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""]
            lines += [f"   {m}" for m in own] + [""]
        if elsewhere:
            lines += ["Also exported here, documented in their own package:", ""]
            lines += [f"* :obj:`{m.split(' ')[0]}`{m[len(m.split(' ')[0]):]}" for m in elsewhere] + [""]
        if submodules:
            lines += ["Submodules: " + ", ".join(f":mod:`{s}`" for s in submodules), ""]
        text = "\n".join(lines)
        path = out / f"{name}.rst"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


_MISSING = object()


def _resolve(target: str, module: str | None):
    """The object an ``otbound`` reference names (``_MISSING`` if none), trying it relative to the
    current module first. A dataclass field counts as existing."""
    candidates = [f"{module}.{target}", target] if module else [target]
    for dotted in candidates:
        parts = dotted.split(".")
        if parts[0] != "otbound":
            continue
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                if hasattr(obj, attr):
                    obj = getattr(obj, attr)
                elif attr in getattr(obj, "__dataclass_fields__", {}):
                    obj = None
                else:
                    obj = _MISSING
                    break
            if obj is not _MISSING:
                return obj
            break
    return _MISSING


def _on_missing_reference(app, env, node, contnode):
    """Resolve references to otbound names that exist but are documented under another name.

    A re-exported object (``otbound.sample_drafts``) links to its canonical page
    (``otbound.token.sample_drafts``); a reference to an existing private module or object, or an
    attribute autodoc did not render, is shown as plain code; a name that does not exist in the code
    keeps its warning, which ``-W`` turns into a failed build."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    obj = _resolve(target, node.get("py:module"))
    if obj is _MISSING:
        return None
    canonical = None
    if obj is not None and not inspect.ismodule(obj) and id(obj) in _HOMES:
        canonical = ".".join(_HOMES[id(obj)])
    elif inspect.ismodule(obj) and obj.__name__ in API_PACKAGES:
        canonical = obj.__name__
    if canonical and canonical != target:
        py = env.get_domain("py")
        found = py.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], canonical, node, contnode)
        if found is None:
            found = py.resolve_xref(env, node["refdoc"], app.builder, "obj", canonical, node, contnode)
        if found is not None:
            return found
    return contnode


_HOMES: dict[int, tuple[str, str]] = {}


#: the layers, lowest first, as ``tests/test_layout.py`` enforces them
_LAYER_NOTES = {
    "token": "token level: draft laws, alpha*, verifiers",
    "block": "block level: models, bounds, block verifiers",
    "objectives": "drafter objectives (torch)",
    "ROOT": "the facade otbound/__init__.py (gathers the token and block layers)",
    "lm": "real models -> laws: pairs, prompts, traces, decoding",
    "report": "measurement, aggregation, report tables and figures",
    "plan": "the planner: shape x draft law x verifier, cost model",
    "conformance": "the conformance kit: check anyone's verifier",
    "engine": "serving engines under audit (llama.cpp, any OpenAI-compatible server)",
    "cli": "the command lines: one module per command, typed options, one error line, one exit-status table",
    "ENTRY": "the python -m entries (otbound/compare.py, every __main__.py): a few lines calling otbound.cli",
}


def _first_line(path: Path) -> str:
    """The first line of a module's docstring (empty if it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def write_layout_page(app=None) -> None:
    """Write the package tree (``contributing/_layout_tree.txt``) and the layer order
    (``contributing/_layout_layers.txt``) from the code as it is, for ``contributing/layout.md``."""
    package = HERE.parent / "otbound"
    lines = ["otbound/"]

    def walk(folder: Path, indent: str) -> None:
        entries = sorted(p for p in folder.iterdir()
                         if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists())
        for i, entry in enumerate(entries):
            last = i == len(entries) - 1
            branch, pad = ("└── ", "    ") if last else ("├── ", "│   ")
            name = entry.name + ("/" if entry.is_dir() else "")
            note = _first_line(entry / "__init__.py" if entry.is_dir() else entry)
            note = note if len(note) <= 88 else note[:87].rstrip() + "…"
            lines.append(f"{(indent + branch + name):<34} {note}".rstrip())
            if entry.is_dir():
                walk(entry, indent + pad)

    walk(package, "")
    test_layout = (HERE.parent / "tests" / "test_layout.py").read_text()
    order = ast.literal_eval(test_layout.split("LAYER_ORDER = ", 1)[1].split("\n", 1)[0])
    layers = [f"{i + 1:>2}. {name:<12} {_LAYER_NOTES.get(name, '')}".rstrip() for i, name in enumerate(order)]
    layers.append("    shared base: otbound/_*.py (validation, backend, solvers, I/O, integrity, replay)")
    for name, text in (("_layout_tree.txt", lines), ("_layout_layers.txt", layers)):
        path = HERE / "contributing" / name
        body = "\n".join(text) + "\n"
        if not path.exists() or path.read_text() != body:
            path.write_text(body)


def setup(app):
    write_layout_page()
    write_api_pages()
    _HOMES.update(_canonical_homes(API_PACKAGES))
    app.connect("missing-reference", _on_missing_reference)

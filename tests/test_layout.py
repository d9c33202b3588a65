"""The package layout: light top-level import, one direction of private imports, no shims."""

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "otbound"
#: top-level modules every layer may use
SHARED_BASE = {"_validation", "_backend", "_solvers", "_io", "_integrity", "_replay"}


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent).stderr


def test_import_otbound_does_not_import_torch_and_is_fast():
    code = "import sys, otbound; assert 'torch' not in sys.modules, 'import otbound imported torch'"
    # best of 3: the machine is shared; one cold start may be slow for reasons outside the package
    seconds = []
    for _ in range(3):
        log = _run(code)
        assert "torch" not in log
        line = next(row for row in log.splitlines() if row.rstrip().endswith("| otbound"))
        seconds.append(int(line.split("|")[1]) / 1e6)  # cumulative microseconds of `import otbound`
    assert min(seconds) < 1.0, f"import otbound took {min(seconds):.2f} s (best of 3)"


def test_objectives_still_reachable_from_the_top_level():
    out = subprocess.run(
        [sys.executable, "-c", "import otbound as ob; import otbound.objectives as m; "
         "assert ob.objectives is m and ob.DrafterObjective is m.DrafterObjective "
         "and ob.expected_accepted_length is m.expected_accepted_length; print('ok')"],
        capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert out.stdout.strip() == "ok"


#: the layers, lowest first: a module imports only from its own layer, a lower one, or the shared base
#: (``ROOT`` is the facade ``otbound/__init__.py``, which gathers the token and block layers; ``cli`` the
#: command lines; ``ENTRY`` the ``python -m`` entries, ``otbound.compare`` and every ``__main__``, which call
#: the command lines)
LAYER_ORDER = ("token", "block", "objectives", "ROOT", "lm", "report", "plan", "conformance", "engine", "cli", "ENTRY")
#: the ``python -m`` entries besides the ``__main__`` modules
ENTRIES = {"otbound.compare"}


def _module_name(file: Path) -> str:
    return ".".join(file.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def _imports(file: Path):
    """``(target module, local?)`` for every import of an otbound module in ``file``: ``from pkg import
    name`` counts as an import of ``pkg.name`` where that is a module, else of ``pkg``."""
    tree = ast.parse(file.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("otbound")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("otbound"):
            targets = []
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                path = PACKAGE.parent.joinpath(*sub.split("."))
                is_module = path.with_suffix(".py").exists() or (path / "__init__.py").exists()
                targets.append(sub if is_module else node.module)
        else:
            continue
        out += [(t, id(node) not in top) for t in targets]
    return out


def _layer_of(module: str) -> str:
    parts = module.split(".")
    if module in ENTRIES or parts[-1] == "__main__":
        return "ENTRY"
    return "ROOT" if len(parts) == 1 else parts[1]


def _graph():
    return {_module_name(f): _imports(f) for f in sorted(PACKAGE.rglob("*.py"))}


def test_no_function_local_import_within_a_layer():
    """Imports between modules of one layer sit at the top of the module: a function-local import
    there hides a cycle (or a dependency) from the reader and from this test."""
    offences = [f"{m} imports {t} inside a function" for m, edges in _graph().items() for t, local in edges
                if local and _layer_of(t) == _layer_of(m) and _layer_of(m) in LAYER_ORDER]
    assert not offences, "\n".join(offences)


def test_imports_follow_the_layer_order():
    """No module imports (at the top or inside a function) from a layer above its own; e.g. the
    language-model layer does not forward the report's measurements."""
    offences = []
    for m, edges in _graph().items():
        here = _layer_of(m)
        for t, _ in edges:
            there = _layer_of(t)
            if there in SHARED_BASE or here in SHARED_BASE:
                if here in SHARED_BASE and there not in SHARED_BASE:
                    offences.append(f"shared base module {m} imports {t}")
                continue
            if LAYER_ORDER.index(there) > LAYER_ORDER.index(here):
                offences.append(f"{m} ({here}) imports {t} ({there})")
    assert not offences, "\n".join(offences)


def test_modules_form_a_dag():
    """The import graph of the package's modules has no cycle (a package importing its own
    submodules is an edge like any other; a submodule importing its package's ``__init__`` closes
    a cycle)."""
    graph = {m: sorted({t for t, _ in edges if t != m}) for m, edges in _graph().items()}
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for t in graph.get(m, []):
            if state.get(t) == "open":
                cycles.append(" -> ".join(path[path.index(t):] + [t]) if t in path else f"{m} -> {t}")
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_private_name_crosses_a_layer():
    """A module imports private names (``_x``) only from its own layer; the shared base modules at
    the top level export public names only."""
    offences = []
    for file in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(file.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(file.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("otbound")):
                continue
            for alias in node.names:
                names = f"{node.module}.{alias.name}".split(".")
                layer = _layer(".".join(names))
                if layer in SHARED_BASE:
                    private = [n for n in names[2:] if n.startswith("_")]
                else:
                    private = [n for n in names[1:] if n.startswith("_")] if layer != _layer(module) else []
                if private:
                    offences.append(f"{module} imports {'.'.join(names)}")
    assert not offences, "\n".join(offences)


#: names the package had before its layer folders: none may resolve (no compatibility shims)
PRE_LAYER_NAMES = ("verifiers", "token_bounds", "reports", "plots", "draft_laws", "block_models", "block_bounds",
                   "block_verifiers", "laws64")
#: the public namespaces, each exporting an object under one name only
PUBLIC_MODULES = ("otbound", "otbound.token", "otbound.token.verifiers", "otbound.block", "otbound.block.verifiers",
                  "otbound.lm", "otbound.report", "otbound.conformance", "otbound.objectives")


def test_no_shims():
    """No pre-refactor alias resolves; no module forwards names on first use (a module-level
    ``__getattr__``) except ``otbound`` itself for the torch-backed objectives, which keeps
    ``import otbound`` torch-free; no public namespace exports one object under two names."""
    import importlib
    import inspect

    import otbound
    import otbound.lm

    resolving = [f"{m.__name__}.{n}" for n in PRE_LAYER_NAMES for m in (otbound, otbound.lm) if hasattr(m, n)]
    assert not resolving, f"compatibility shims resolve: {resolving}"
    forwarders = []
    for file in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(file.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            forwarders.append(str(file.relative_to(PACKAGE.parent)))
    assert forwarders == ["otbound/__init__.py"], forwarders
    lazy = {n for n in dir(otbound.objectives) if not n.startswith("_")}
    assert set(otbound._OBJECTIVES) - {"objectives"} <= lazy  # forwards the objectives and nothing else
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        seen = {}
        for name in getattr(mod, "__all__", [n for n in vars(mod) if not n.startswith("_")]):
            obj = getattr(mod, name)
            if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj):
                assert id(obj) not in seen, f"{module} exports {seen[id(obj)]} and {name}: one object, two names"
                seen[id(obj)] = name


#: a private name of the package: an ``otbound._x`` module or attribute at any depth
#: (``otbound._solvers.x``, ``otbound.lm._decode``) or an ``_x`` name imported from otbound; dunders
#: (``otbound.__version__``) are public
PRIVATE_USE = re.compile(r"\botbound(\.\w+)*\._(?!_)\w+|from otbound[\w.]* import [^\n]*\b_(?!_)\w+")
#: a fenced code block of a documentation page: its info string and its body
FENCE = re.compile(r"^```\{?([\w-]*)\}?[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _private_module_attributes(source: str) -> list[str]:
    """``alias._x`` where ``alias`` names an otbound module (``from otbound.token import bounds as
    tb``; ``import otbound as ob``): private access that :data:`PRIVATE_USE` cannot see."""
    tree = ast.parse(source)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "otbound"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "otbound":
            for a in node.names:
                path = PACKAGE.parent.joinpath(*f"{node.module}.{a.name}".split("."))
                if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
                    modules.add(a.asname or a.name)
    return [f"line {node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
            and node.attr.startswith("_") and not node.attr.startswith("__")]


def _doc_code(page: str) -> str:
    """The code of a page's fenced blocks: every line of a ``python`` or shell block, the ``>>>`` / ``...``
    input lines of a ``pycon`` / ``doctest`` block (its output, e.g. an exception's module path, is
    not code)."""
    code = []
    for info, body in FENCE.findall(page):
        if info in ("python", "py", "code-cell", "ipython3", "bash", "console", "shell"):
            code.append(body)
        elif info in ("pycon", "doctest"):
            code += [line[4:] for line in body.splitlines() if line.startswith((">>> ", "... "))]
    return "\n".join(code)


def test_notebooks_experiments_and_doc_examples_use_the_public_api_only():
    """What users read and run uses public names only, as users must: the notebooks' code cells,
    the experiment scripts (text and module attributes) and the code of the documentation pages'
    examples import no ``otbound._x`` module and no ``_x`` name."""
    import json

    root = PACKAGE.parent
    offences = []
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                offences += [f"{nb.name}: {m.group(0)}" for m in PRIVATE_USE.finditer("".join(cell["source"]))]
    for script in sorted((root / "experiments").glob("*.py")):
        source = script.read_text()
        offences += [f"experiments/{script.name}: {m.group(0)}" for m in PRIVATE_USE.finditer(source)]
        offences += [f"experiments/{script.name}: {use}" for use in _private_module_attributes(source)]
    for page in sorted((root / "docs").rglob("*.md")):
        code = _doc_code(page.read_text())
        offences += [f"{page.relative_to(root)}: {m.group(0)}" for m in PRIVATE_USE.finditer(code)]
    assert not offences, "\n".join(offences)

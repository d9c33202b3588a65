"""The command-line wing: argparse only in otbound/cli, flags and options objects one to one,
options validated when made and frozen, one exit-status table."""

import ast
import dataclasses
from pathlib import Path

import pytest

import otbound as ob
from otbound.cli import ExitStatus, OneLineParser, draft_law_names, error_line, parse_options, verifier_names
from otbound.cli import compare as cmp
from otbound.cli import conformance as cf
from otbound.cli import engine as eg
from otbound.cli import plan as pn

PACKAGE = Path(ob.__file__).resolve().parent
COMMANDS = [(cmp.parser, cmp.CompareOptions), (pn.parser, pn.PlanOptions), (cf.parser, cf.ConformanceOptions),
            (eg.parser, eg.EngineOptions)]


def test_argparse_is_imported_only_by_the_command_lines():
    offences = []
    for file in sorted(PACKAGE.rglob("*.py")):
        if file.relative_to(PACKAGE).parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(file.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and n.split(".")[0] == "argparse" for n in names):
                offences.append(str(file.relative_to(PACKAGE)))
    assert not offences, offences


def test_the_python_m_entries_are_a_few_lines():
    for entry in ("compare.py", "plan/__main__.py", "conformance/__main__.py", "engine/__main__.py"):
        tree = ast.parse((PACKAGE / entry).read_text())
        code = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        assert len(code) <= 3, f"{entry}: {len(code)} statements"
        assert any(isinstance(n, ast.ImportFrom) and n.module.startswith("otbound.cli.") for n in code), entry


@pytest.mark.parametrize("make_parser, options", COMMANDS, ids=lambda x: getattr(x, "__name__", ""))
def test_every_flag_is_a_field_of_the_options_and_back(make_parser, options):
    dests = {a.dest for a in make_parser()._actions if a.dest != "help"}
    fields = {f.name for f in dataclasses.fields(options) if f.init}
    assert dests == fields


@pytest.mark.parametrize("make_parser, options", COMMANDS, ids=lambda x: getattr(x, "__name__", ""))
def test_the_parsers_defaults_are_the_options_defaults(make_parser, options):
    """A default written twice must be the same twice (the parser's, and the options made in code)."""
    fields = {f.name: f for f in dataclasses.fields(options) if f.init}
    for action in make_parser()._actions:
        f = fields.get(action.dest)
        if f is None or f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        given = tuple(action.default) if isinstance(action.default, list) else action.default
        assert given == default, action.dest


def test_options_are_frozen_and_refuse_bad_values(tmp_path):
    o = pn.PlanOptions(synthetic=True, out=str(tmp_path / "p"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.max_depth = 0
    with pytest.raises(ob.InvalidInputError, match=r"unknown draft law\(s\) \['gumbel'\]"):
        pn.PlanOptions(synthetic=True, laws=["gumbel"], out=str(tmp_path / "p"))
    with pytest.raises(ob.InvalidInputError, match="--mc-samples must be a positive integer, got 0"):
        cmp.CompareOptions(synthetic=True, mc_samples=0, out=str(tmp_path / "r"))
    with pytest.raises(ob.InvalidInputError, match="--top-p must lie in"):
        cmp.CompareOptions(synthetic=True, top_p=1.5, out=str(tmp_path / "r"))
    with pytest.raises(ob.InvalidInputError, match="--sampling 'gumbel'"):
        cf.ConformanceOptions("m:f", level="token", num_drafts=2, sampling="gumbel")
    with pytest.raises(ob.InvalidInputError, match="unknown engine 'vllm'"):
        eg.EngineOptions(synthetic=True, engine="vllm")


def test_compare_options_fill_the_effective_defaults(tmp_path):
    real = cmp.CompareOptions(synthetic=False, pair="qwen2.5-coder", out=str(tmp_path / "r"))
    assert (real.num_drafts, real.temperature, real.mc_samples, real.block_mc_samples) == ((2, 3, 4), (0.7, 1.0),
                                                                                            16, 20_000)
    assert (real.device, real.dtype) == ("auto", "auto")
    given = cmp.CompareOptions(synthetic=True, mc_samples=300, num_drafts=[3], out=str(tmp_path / "r"))
    assert (given.num_drafts, given.mc_samples, given.block_mc_samples) == ((3,), 300, 300)


def test_the_registries_name_the_choices():
    assert draft_law_names() == tuple(ob.DRAFT_LAWS)
    assert pn.PlanOptions.__dataclass_fields__["laws"].default_factory() == tuple(ob.SAMPLINGS)
    assert set(ob.SAMPLINGS) < set(ob.DRAFT_LAWS)  # a slow law (systematic) is offered, not run unasked
    sampling = next(a for a in cf.parser()._actions if a.dest == "sampling")
    assert tuple(sampling.choices) == tuple(ob.DRAFT_LAWS)
    assert verifier_names("token") == tuple(ob.VERIFIERS) and verifier_names("block") == tuple(ob.BLOCK_VERIFIERS)


def test_one_parser_style_one_error_line(capsys):
    ap = OneLineParser(prog="demo")
    ap.add_argument("--k", type=int, default=1)

    @dataclasses.dataclass(frozen=True)
    class Options:
        k: int = 1

        def __post_init__(self):
            if self.k < 1:
                raise ob.InvalidInputError(f"--k must be ≥ 1,\n got {self.k}")

    assert parse_options(ap, ["--k", "3"], Options) == Options(3)
    for argv, message in ((["--k", "x"], "argument --k: invalid int value: 'x'"),
                          (["--k", "0"], "--k must be ≥ 1, got 0"), (["--j"], "unrecognized arguments: --j")):
        with pytest.raises(SystemExit) as exc:
            parse_options(ap, argv, Options)
        assert exc.value.code == ExitStatus.USAGE == 2
        assert capsys.readouterr().err == f"demo: error: {message}\n"
    assert error_line("a\n  b", "p") == "p: error: a b"


def test_the_exit_status_table():
    assert {s.name: int(s) for s in ExitStatus} == {"OK": 0, "FAILED": 1, "USAGE": 2, "INTERRUPTED": 130}


def test_ctrl_c_while_the_options_are_checked_is_one_line_and_130(capsys):
    def interrupted_check(**flags):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exc:
        parse_options(OneLineParser(prog="demo"), [], interrupted_check)
    assert exc.value.code == ExitStatus.INTERRUPTED == 130
    assert capsys.readouterr().err == "demo: interrupted; nothing was done\n"

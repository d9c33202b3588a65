"""The command lines' parser, error line, exit statuses, flag types and registry names.

An error a user can cause is one line on stderr, ``"{prog}: error: {message}"`` (the kit's lines,
read by scripts as ``"error: {message}"``, carry no prefix), its whitespace, newlines included,
collapsed to single spaces — never a traceback, never a second line — and exit status 2.
"""

from __future__ import annotations

import argparse
import enum
import math
import sys
from typing import NoReturn

from otbound._validation import InvalidInputError


class ExitStatus(enum.IntEnum):
    """The exit statuses of every command line (:mod:`otbound.cli`).

    Examples
    --------
    >>> from otbound.cli import ExitStatus
    >>> [int(s) for s in ExitStatus]
    [0, 1, 2, 130]
    """

    #: done (a verdict, where the command gives one, passed)
    OK = 0
    #: a verdict failed (``python -m otbound.conformance``: not lossless)
    FAILED = 1
    #: bad input or usage: one line on stderr
    USAGE = 2
    #: Ctrl-C: one line on stderr
    INTERRUPTED = 130


def error_line(message, prog: str | None = None) -> str:
    """``"{prog}: error: {message}"`` (``"error: {message}"`` without ``prog``) on one line: every run
    of whitespace in ``message``, newlines included, becomes one space.

    Examples
    --------
    >>> from otbound.cli import error_line
    >>> error_line("no such file\\n  (give a path)", "python -m otbound.plan")
    'python -m otbound.plan: error: no such file (give a path)'
    >>> error_line(ValueError("bad value"))
    'error: bad value'
    """
    text = " ".join(str(message).split())
    return f"{prog}: error: {text}" if prog else f"error: {text}"


def print_error(message, prog: str | None = None) -> ExitStatus:
    """Print :func:`error_line` on stderr; returns :attr:`ExitStatus.USAGE` for a ``main`` that
    returns its exit status."""
    print(error_line(message, prog), file=sys.stderr)
    return ExitStatus.USAGE


def exit_error(message, prog: str | None = None) -> NoReturn:
    """Print :func:`error_line` on stderr and end with :attr:`ExitStatus.USAGE` (a ``SystemExit``
    without the exception being handled as its context)."""
    raise SystemExit(print_error(message, prog)) from None


def interrupted(message: str) -> NoReturn:
    """Ctrl-C: print ``message`` (one line) on stderr and end with :attr:`ExitStatus.INTERRUPTED`."""
    print(message, file=sys.stderr)
    raise SystemExit(ExitStatus.INTERRUPTED) from None


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors (an unknown flag, a value its type refuses, a missing
    argument) raise :class:`~otbound.InvalidInputError` instead of printing the usage: the command
    prints it as its one error line, exit status 2 (see :func:`parse_options`). ``--help`` prints
    the help and exits 0.

    Examples
    --------
    >>> from otbound.cli import OneLineParser
    >>> ap = OneLineParser(prog="demo")
    >>> _ = ap.add_argument("--k", type=int)
    >>> ap.parse_args(["--k", "two"])
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: argument --k: invalid int value: 'two'
    """

    def error(self, message) -> NoReturn:
        raise InvalidInputError(message)


def parse_options(parser: OneLineParser, argv, options_type):
    """``options_type(**flags)``: the validated options of the command line ``argv`` (default:
    ``sys.argv[1:]``); a flag that does not parse or options that do not validate end in one line
    on stderr and :attr:`ExitStatus.USAGE`; Ctrl-C meanwhile in one line and
    :attr:`ExitStatus.INTERRUPTED`.

    Examples
    --------
    >>> import dataclasses
    >>> from otbound.cli import OneLineParser, parse_options
    >>> @dataclasses.dataclass(frozen=True)
    ... class Options:
    ...     k: int = 1
    >>> ap = OneLineParser(prog="demo")
    >>> _ = ap.add_argument("--k", type=int, default=1)
    >>> parse_options(ap, ["--k", "2"], Options)
    Options(k=2)
    """
    try:
        return options_type(**vars(parser.parse_args(argv)))
    except InvalidInputError as err:
        exit_error(err, parser.prog)
    except KeyboardInterrupt:  # while the options are checked (a prompt file read, torch loaded): nothing done
        interrupted(f"{parser.prog}: interrupted; nothing was done")


def draft_law_names() -> tuple[str, ...]:
    """The registered draft laws' names, in registry order (the ``sampling`` names).

    Examples
    --------
    >>> from otbound.cli import draft_law_names
    >>> "with_replacement" in draft_law_names()
    True
    """
    from otbound.token import DRAFT_LAWS

    return tuple(DRAFT_LAWS)


def default_law_names() -> tuple[str, ...]:
    """The draft laws measured and planned when none is named (:data:`otbound.SAMPLINGS`: the
    registered laws marked default; a law with a slow exact kernel, e.g. ``systematic``, is
    offered but not run unasked).

    Examples
    --------
    >>> from otbound.cli import default_law_names, draft_law_names
    >>> set(default_law_names()) < set(draft_law_names())
    True
    """
    from otbound.token.draft_laws import SAMPLINGS

    return tuple(SAMPLINGS)


def verifier_names(level: str = "token") -> tuple[str, ...]:
    """The registered verifiers' names at ``level`` (``"token"`` or ``"block"``), in registry order."""
    if level == "token":
        from otbound.token.verifiers import VERIFIERS

        return tuple(VERIFIERS)
    from otbound.block.verifiers import BLOCK_VERIFIERS

    return tuple(BLOCK_VERIFIERS)


# ---------------------------------------------------------------------------------------------
# flag types: a value that does not fit is an argparse error (one line, exit status 2)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def vocabulary(text: str) -> int:
    value = _int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"a vocabulary needs at least 2 tokens, got {text!r}")
    return value


def _number(text: str, ok, requirement: str) -> float:
    """``text`` as a float satisfying ``ok``, else an argparse error stating ``requirement``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must {requirement}, got {text!r}")
    return value


def temperature(text: str) -> float:
    return _number(text, lambda v: math.isfinite(v) and v > 0, "be a finite temperature > 0")


def probability(text: str) -> float:
    return _number(text, lambda v: 0.0 <= v <= 1.0, "lie in [0, 1]")


def penalty(text: str) -> float:
    return _number(text, lambda v: math.isfinite(v) and v > 0, "be a finite number > 0")

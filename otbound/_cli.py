"""The command lines' one error style: a failure a user can cause is one line on stderr, exit status 2.

Used by ``python -m otbound.compare``, ``python -m otbound.plan`` and ``python -m otbound.conformance``
(their argument parsers and their ``main``), so that every error they print has one form:
``"{prog}: error: {message}"`` (the kit's lines, read by scripts as ``"error: {message}"``, carry no
prefix), its whitespace, newlines included, collapsed to single spaces — never a traceback, never a
second line.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

#: exit status of every failure a user can cause (bad flags, bad input, a locked or unwritable folder)
USAGE_ERROR = 2


def error_line(message, prog: str | None = None) -> str:
    """``"{prog}: error: {message}"`` (``"error: {message}"`` without ``prog``) on one line: every run
    of whitespace in ``message``, newlines included, becomes one space.

    Examples
    --------
    >>> from otbound._cli import error_line
    >>> error_line("no such file\\n  (give a path)", "python -m otbound.plan")
    'python -m otbound.plan: error: no such file (give a path)'
    >>> error_line(ValueError("bad value"))
    'error: bad value'
    """
    text = " ".join(str(message).split())
    return f"{prog}: error: {text}" if prog else f"error: {text}"


def print_error(message, prog: str | None = None) -> int:
    """Print :func:`error_line` on stderr; returns :data:`USAGE_ERROR` for a ``main`` that returns its
    exit status."""
    print(error_line(message, prog), file=sys.stderr)
    return USAGE_ERROR


def exit_error(message, prog: str | None = None) -> NoReturn:
    """Print :func:`error_line` on stderr and end with exit status :data:`USAGE_ERROR` (a
    ``SystemExit`` without the exception being handled as its context)."""
    raise SystemExit(print_error(message, prog)) from None


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are :func:`error_line` (no usage dump), exit status 2."""

    def error(self, message) -> NoReturn:
        self.exit(USAGE_ERROR, error_line(message, self.prog) + "\n")

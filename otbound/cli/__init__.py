"""The command lines: one parser style, one error style, one exit-status table.

One module per command — :mod:`~otbound.cli.compare` (``python -m otbound.compare``),
:mod:`~otbound.cli.plan` (``python -m otbound.plan``), :mod:`~otbound.cli.conformance`
(``python -m otbound.conformance``) and :mod:`~otbound.cli.engine` (``python -m otbound.engine``);
the ``python -m`` modules are entries of a few lines that call them. Each command parses its flags
with a :class:`OneLineParser` into a typed, validated options object (a frozen dataclass: the
library functions take such objects or plain arguments, never an argument namespace) and runs it.

Exit status, every command (:class:`ExitStatus`):

* 0 — done (``conformance``: the verifier is lossless);
* 1 — a verdict failed (``conformance``: the verifier is not lossless, the counterexample on
  stdout; the only command with verdicts);
* 2 — bad input or usage: one line on stderr, ``"{prog}: error: {message}"`` (the conformance
  kit's lines, read by scripts, are ``"error: {message}"``), never a traceback;
* 130 — interrupted (Ctrl-C): one line on stderr saying what was kept.
"""

from otbound.cli._common import (
    ExitStatus,
    OneLineParser,
    default_law_names,
    draft_law_names,
    error_line,
    exit_error,
    interrupted,
    parse_options,
    print_error,
    verifier_names,
)

__all__ = ["ExitStatus", "OneLineParser", "default_law_names", "draft_law_names", "error_line", "exit_error",
           "interrupted", "parse_options", "print_error", "verifier_names"]

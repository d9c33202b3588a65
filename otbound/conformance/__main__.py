"""``python -m otbound.conformance MODULE:FUNCTION --level token|block --num-drafts K [options]``.

Checks the verifier ``FUNCTION`` of module ``MODULE`` (importable from the current directory or
the Python path) with :func:`otbound.conformance.check_token_verifier` or
:func:`~otbound.conformance.check_block_verifier`, prints a one-screen verdict and writes
``report.json`` and ``report.md`` into ``--out`` (atomically).

Exit status: 0 lossless, 1 not lossless (or the verifier broke the kit's contract), 2 bad usage
(one line on stderr: a bad flag, an unimportable module or function, an impossible setting).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from otbound import InvalidInputError
from otbound.conformance._block import check_block_verifier
from otbound.conformance._token import check_token_verifier
from otbound.conformance._tree import ConformanceError

DEFAULT_INSTANCES = {"token": 24, "block": 8}


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the whole usage otherwise)
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="python -m otbound.conformance",
        description="Check a verifier for losslessness and its distance to the optimum.",
    )
    ap.add_argument("function", metavar="MODULE:FUNCTION", help="the verifier, e.g. mypkg.verify:rrs")
    ap.add_argument("--level", choices=("token", "block"), required=True)
    ap.add_argument("--num-drafts", type=int, required=True, metavar="K")
    ap.add_argument("--vocab-size", type=int, default=None, metavar="V", help="default 3 (token), 2 (block)")
    ap.add_argument("--block-len", type=int, default=2, metavar="L", help="block level only (default 2)")
    ap.add_argument(
        "--sampling",
        default="with_replacement",
        choices=("with_replacement", "without_replacement", "greedy"),
        help="token level only",
    )
    ap.add_argument("--mode", choices=("exact", "sample"), default="exact")
    ap.add_argument("--batch", action="store_true", help="sample mode: the function takes and returns batches")
    ap.add_argument("--instances", type=int, default=None, metavar="N", help="default 24 (token), 8 (block)")
    ap.add_argument("--seed", type=int, default=0, metavar="S")
    ap.add_argument("--out", default="conformance-report", metavar="DIR")
    return ap


def load(spec: str):
    """The object named by ``MODULE:FUNCTION`` (``_UsageError`` with one sentence if it is not there)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise _UsageError(f"expected MODULE:FUNCTION, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")  # a module in the current directory
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 — any import failure is the user's module's: report it in one line
        raise _UsageError(f"cannot import module {module!r}: {type(exc).__name__}: {exc}") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _UsageError(f"module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _UsageError(f"{spec} is not callable")
    return obj


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
        verify = load(args.function)
        common = dict(
            num_drafts=args.num_drafts,
            instances=args.instances or DEFAULT_INSTANCES[args.level],
            seed=args.seed,
            mode=args.mode,
            batch=args.batch,
            name=args.function,
        )
        if args.level == "token":
            result = check_token_verifier(verify, vocab_size=args.vocab_size or 3, sampling=args.sampling, **common)
        else:
            result = check_block_verifier(verify, vocab_size=args.vocab_size or 2, block_len=args.block_len, **common)
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ConformanceError as exc:
        print(f"FAIL: {args.function} broke the verifier contract: {exc}", file=sys.stderr)
        return 1
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = result.write(args.out)
    print(result.summary())
    print(f"\nreport: {out / 'report.md'}, {out / 'report.json'}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m otbound.conformance MODULE:FUNCTION --level token|block --num-drafts K [options]``.

Checks the verifier ``FUNCTION`` of ``MODULE`` (a module importable from the current directory or
the Python path, or a file ``path/to/file.py``) with :func:`otbound.conformance.check_token_verifier`
or :func:`~otbound.conformance.check_block_verifier`, prints a one-screen verdict and writes
``report.json`` and ``report.md`` into ``--out`` (default ``./conformance-report``, atomically).

The function is called as (``--level``, ``--mode``):

* token, exact: ``verify(p, q, drafts, coin, draw) -> token``
* token, sample: ``verify(p, q, drafts, rng) -> token`` (``--batch``: drafts (n, K) -> tokens (n,))
* block, exact: ``verify(target, draft, blocks, coin, draw) -> tokens``
* block, sample: ``verify(target, draft, blocks, rng) -> tokens`` (``--batch``: blocks (n, K, L) -> (n, L + 1))

``--drafter-invariance`` (token level) checks a procedure ``procedure(p, q, K, rng) -> (drafts, token)``
instead (:func:`otbound.conformance.check_drafter_invariance`): exit 1 when its token depends on q.

``--as-sampler`` runs a coin/draw (exact-mode) function in sample mode through
:func:`otbound.conformance.as_sampler`. ``--drafting top-k`` (block level) drafts the deterministic
top-K tree (:func:`otbound.conformance.top_k_tree`); ``--drafting MODULE:NAME`` a user's
:class:`~otbound.conformance.DraftingScheme`.

Exit status: 0 lossless; 1 not lossless (the verdict and the counterexample on stdout); 2 a usage or
contract error, one line on stderr and no traceback: a bad or inapplicable option (``--block-len``
at token level, ``--batch`` in exact mode, …), an unimportable module or function, a function whose
signature does not fit the level and mode, a verifier that raised or broke the kit's contract (bad
probability, nondeterminism, a token verifier run at block level), an impossible instance request,
an ``--out`` that is not a writable directory, or a check that ran past ``--time-limit`` (default
600 s) or ``--max-branches`` (default 200,000 branches per draft tuple). A verifier that calls
``sys.exit`` is a verifier that raised (exit 2, no verdict); one that catches the time-limit
interruption is interrupted again every second and, if it still goes on, stopped
:data:`HARD_STOP_SECONDS` later (exit 2, nothing written). Ctrl-C: one line, exit 130, no report.
A verdict (0 or 1) is only ever given after a completed check.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from otbound import DRAFT_LAWS, InvalidInputError
from otbound._cli import print_error
from otbound.conformance._adapters import as_sampler
from otbound.conformance._block import check_block_verifier
from otbound.conformance._drafting import as_drafting, top_k_tree
from otbound.conformance._invariance import check_drafter_invariance
from otbound.conformance._token import check_token_verifier
from otbound.conformance._tree import MAX_BRANCHES, VIOLATIONS, ConformanceError, raise_recorded

DEFAULT_INSTANCES = {"token": 24, "block": 8}
DEFAULT_VOCAB = {"token": 3, "block": 2}
DEFAULT_BLOCK_LEN = 2
DEFAULT_OUT = "conformance-report"
#: seconds a whole check may run (a verifier that never returns is stopped)
DEFAULT_TIME_LIMIT = 600.0
#: seconds past the time limit after which a verifier that keeps catching the interruption is
#: stopped with the process (one line on stderr, exit status 2)
HARD_STOP_SECONDS = 5.0
SIGNATURES = {
    ("token", "exact"): "verify(p, q, drafts, coin, draw) -> token",
    ("token", "sample"): "verify(p, q, drafts, rng) -> token",
    ("block", "exact"): "verify(target, draft, blocks, coin, draw) -> tokens",
    ("block", "sample"): "verify(target, draft, blocks, rng) -> tokens",
}
OTHER_LEVEL = {
    "token": "a block verifier (target, draft models and blocks) needs --level block",
    "block": "a token verifier (laws p, q and a draft tuple) needs --level token",
}


class _UsageError(Exception):
    pass


class _Timeout(BaseException):  # not an Exception: the verifier's own `except Exception` cannot swallow it
    pass


class _Crash(Exception):
    def __init__(self, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the whole usage otherwise)
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="python -m otbound.conformance",
        description="Check a verifier for losslessness and its distance to the optimum. Exit status: 0 lossless, "
        "1 not lossless, 2 usage or contract error (one line on stderr).",
    )
    ap.add_argument(
        "function", metavar="MODULE:FUNCTION", help="the verifier: mypkg.verify:rrs or path/to/file.py:rrs"
    )
    ap.add_argument("--level", choices=("token", "block"), required=True)
    ap.add_argument("--num-drafts", type=int, required=True, metavar="K")
    ap.add_argument("--vocab-size", type=int, default=None, metavar="V", help="default 3 (token), 2 (block)")
    ap.add_argument("--block-len", type=int, default=None, metavar="L", help="block level only (default 2)")
    ap.add_argument(
        "--sampling",
        default=None,
        choices=tuple(DRAFT_LAWS),
        help="token level only (default with_replacement)",
    )
    ap.add_argument("--drafting", default=None, metavar="SCHEME",
                    help="block level: 'top-k' (the deterministic top-K tree, K = --num-drafts) or MODULE:NAME / "
                    "file.py:NAME of a DraftingScheme (default: K i.i.d. blocks)")  # fmt: skip
    ap.add_argument("--mode", choices=("exact", "sample"), default="exact", help="default exact")
    ap.add_argument("--drafter-invariance", action="store_true",
                    help="token level: FUNCTION is a procedure(p, q, K, rng) -> (drafts, token); check that "
                    "its token does not depend on q given the stream (exit 1 with a counterexample if it does)")
    ap.add_argument("--batch", action="store_true", help="sample mode: the function takes and returns batches")
    ap.add_argument(
        "--as-sampler", action="store_true", help="sample mode: FUNCTION is a coin/draw verifier, run with a generator"
    )
    ap.add_argument("--samples", type=int, default=None, metavar="N", help="sample mode: per instance (default: "
                    "the smallest with power 0.99 against a 0.01 distortion)")  # fmt: skip
    ap.add_argument("--precision", choices=("float64", "float32"), default=None,
                    help="exact mode: tolerance 1e-10 (float64, default) or 1e-6 (float32 verifiers)")  # fmt: skip
    ap.add_argument("--tolerance", type=float, default=None, help="exact mode: max |law - target| allowed")
    ap.add_argument("--max-branches", type=int, default=None, metavar="B",
                    help=f"exact mode: branches per draft tuple (default {MAX_BRANCHES})")  # fmt: skip
    ap.add_argument("--instances", type=int, default=None, metavar="N", help="default 24 (token), 8 (block)")
    ap.add_argument("--seed", type=int, default=0, metavar="S", help="default 0")
    ap.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                    help=f"stop a check running longer (default {DEFAULT_TIME_LIMIT:g})")  # fmt: skip
    ap.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                    help=f"report directory, created if absent (default: ./{DEFAULT_OUT})")  # fmt: skip
    return ap


def _drafting(spec: str | None):
    if spec is None:
        return None
    if spec == "top-k":
        return "top-k"
    scheme = load(spec, need_callable=False)
    try:
        return as_drafting(scheme)
    except InvalidInputError as exc:
        raise _UsageError(f"--drafting {spec}: {exc}") from None


def load(spec: str, need_callable: bool = True):
    """The object named by ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` (``_UsageError`` with
    one sentence if it is not there)."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise _UsageError(f"expected MODULE:FUNCTION or path/to/file.py:FUNCTION, got {spec!r}")
    if module.endswith(".py") or "/" in module or os.sep in module:
        path = Path(module)
        if not path.is_file():
            raise _UsageError(f"no such file {module!r}")
        name = f"_otbound_user_{path.stem}"
        sys.path.insert(0, str(path.resolve().parent))  # its own sibling imports
        try:
            spec_ = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec_)
            sys.modules[name] = mod
            spec_.loader.exec_module(mod)
        except Exception as exc:  # noqa: BLE001 — the user's file: report it in one line
            raise _UsageError(f"cannot import file {module!r}: {type(exc).__name__}: {exc}") from None
    else:
        if "" not in sys.path:
            sys.path.insert(0, "")  # a module in the current directory
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 — any import failure is the user's module's: report it in one line
            raise _UsageError(f"cannot import module {module!r}: {type(exc).__name__}: {exc}") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _UsageError(f"{module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if need_callable and not callable(obj):
        raise _UsageError(f"{spec} is not callable")
    return obj


def _takes(fn, n: int) -> bool | None:
    """Whether ``fn`` accepts ``n`` positional arguments (None if its signature cannot be read)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*range(n))
    except TypeError:
        return False
    return True


def _check_options(args) -> None:
    """Refuse options that do not apply (an option silently ignored is an option misread)."""
    if args.level == "token" and args.block_len is not None:
        raise _UsageError("--block-len applies to --level block only")
    if args.level == "token" and args.drafting is not None:
        raise _UsageError("--drafting applies to --level block only (token drafts follow --sampling)")
    if args.drafter_invariance and (args.level != "token" or args.mode != "exact" or args.sampling is not None):
        raise _UsageError("--drafter-invariance checks a token-level procedure on i.i.d. drafts: "
                          "use --level token without --mode sample or --sampling")
    if args.level == "block" and args.sampling is not None:
        raise _UsageError("--sampling applies to --level token only (block drafts are K i.i.d. blocks)")
    if args.mode == "exact":
        for flag, given in (("--batch", args.batch), ("--as-sampler", args.as_sampler),
                            ("--samples", args.samples is not None)):  # fmt: skip
            if given:
                raise _UsageError(f"{flag} applies to --mode sample only")
    else:
        for flag, given in (("--precision", args.precision), ("--tolerance", args.tolerance),
                            ("--max-branches", args.max_branches)):  # fmt: skip
            if given is not None:
                raise _UsageError(f"{flag} applies to --mode exact only")
        if args.as_sampler and args.batch:
            raise _UsageError("--as-sampler runs a per-call coin/draw function; it cannot be combined with --batch")
    if args.precision is not None and args.tolerance is not None:
        raise _UsageError("give --precision or --tolerance, not both")
    if not args.time_limit > 0:
        raise _UsageError(f"--time-limit must be positive, got {args.time_limit:g}")
    if args.seed < 0:
        raise _UsageError(f"--seed must be non-negative, got {args.seed}")


def _check_signature(fn, args) -> None:
    """The function must take the arguments the level and mode pass (5 with coin, draw; 4 with rng)."""
    n = 5 if args.mode == "exact" or args.as_sampler else 4
    ok = _takes(fn, n)
    if ok is not False:
        return
    want = SIGNATURES[(args.level, "exact" if args.as_sampler else args.mode)]
    other = _takes(fn, 9 - n)
    hint = ""
    if other and n == 4:
        hint = ": it takes 5 (… coin, draw), an exact-mode verifier: use --mode exact, or --as-sampler to sample it"
    elif other:
        hint = ": it takes 4 (… rng), a sample-mode verifier: use --mode sample"
    raise _UsageError(f"{args.function}{inspect.signature(fn)} cannot be called as {want}{hint}")


def _check_out(out: str) -> Path:
    """``out`` as a directory this process can write (created if absent), else ``_UsageError``."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise _UsageError(f"--out {out!r} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise _UsageError(f"--out {out!r} is not a writable directory ({exc.strerror or exc})") from None
    return path


def _guarded(verify):
    """``verify`` whose own exceptions (not the kit's) become ``_Crash``, reported in one line; so
    does ``SystemExit`` (a verifier calling ``sys.exit(0)`` must not end the check as "lossless").
    After the call: a routing error the verifier caught, or a time limit it swallowed, is raised."""
    def call(*a):
        VIOLATIONS.clear()  # only this call's routing errors count
        try:
            out = verify(*a)
        except (ConformanceError, _Timeout, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 — the user's code, sys.exit included: reported, never a traceback
            raise _Crash(exc) from None
        if _EXPIRED:
            raise _Timeout
        raise_recorded()
        return out

    call.__qualname__ = getattr(verify, "__qualname__", "verify")
    if hasattr(verify, "lossless"):  # a declared flag (the package's adapters) reaches the summary
        call.lossless = verify.lossless
    return call


_EXPIRED: list = []  # non-empty once the time limit has passed


@contextlib.contextmanager
def _time_limit(seconds: float, message: str = "the check did not finish within its time limit"):
    """Raise :class:`_Timeout` after ``seconds``, then every second again (a verifier may catch
    it); :data:`HARD_STOP_SECONDS` after the limit, print ``message`` and end the process (exit 2)."""
    _EXPIRED.clear()

    def stop(signum, frame):
        _EXPIRED.append(time.monotonic())
        if _EXPIRED[-1] - _EXPIRED[0] >= HARD_STOP_SECONDS:
            print_error(f"{message} (it caught the interruption and went on: stopped)")
            sys.stderr.flush()
            os._exit(2)
        raise _Timeout

    if not hasattr(signal, "setitimer") or os.name == "nt":
        yield
        return
    try:
        old = signal.signal(signal.SIGALRM, stop)
    except ValueError:  # not the main thread: no alarm
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        _EXPIRED.clear()


def _run(args):
    verify = load(args.function)
    if args.drafter_invariance:
        if _takes(verify, 4) is False:
            raise _UsageError(f"{args.function}{inspect.signature(verify)} cannot be called as "
                              "procedure(p, q, num_drafts, rng) -> (drafts, token)")
        out = _check_out(args.out)
        with _time_limit(args.time_limit):
            result = check_drafter_invariance(
                _guarded(verify), vocab_size=DEFAULT_VOCAB["token"] if args.vocab_size is None else args.vocab_size,
                num_drafts=args.num_drafts, seed=args.seed, name=args.function,
                instances=DEFAULT_INSTANCES["token"] if args.instances is None else args.instances)
        return result, out
    _check_signature(verify, args)
    drafting = _drafting(args.drafting)
    if drafting == "top-k":
        drafting = top_k_tree(args.num_drafts)
    out = _check_out(args.out)
    if args.as_sampler:
        verify = as_sampler(verify)
    common = dict(
        num_drafts=args.num_drafts,
        instances=DEFAULT_INSTANCES[args.level] if args.instances is None else args.instances,
        seed=args.seed,
        mode=args.mode,
        name=args.function,
        vocab_size=DEFAULT_VOCAB[args.level] if args.vocab_size is None else args.vocab_size,
    )
    if args.mode == "exact":
        common.update(precision=args.precision or "float64", tolerance=args.tolerance,
                      max_branches=MAX_BRANCHES if args.max_branches is None else args.max_branches)  # fmt: skip
    else:
        common.update(batch=args.batch, samples=args.samples)
    limit = f"{args.function} did not finish within --time-limit {args.time_limit:g} s"
    with _time_limit(args.time_limit, limit):
        if args.level == "token":
            result = check_token_verifier(_guarded(verify), sampling=args.sampling or "with_replacement", **common)
        else:
            block_len = DEFAULT_BLOCK_LEN if args.block_len is None else args.block_len
            result = check_block_verifier(_guarded(verify), block_len=block_len, drafting=drafting, **common)
        if _EXPIRED:  # the limit passed while the kit's own code ran: the check is not complete
            raise _Timeout
    return result, out


def main(argv=None) -> int:
    args = None
    try:
        args = _parser().parse_args(argv)
        _check_options(args)
        result, out = _run(args)
        result.write(out)
    except KeyboardInterrupt:
        print("python -m otbound.conformance: interrupted; no verdict, no report written", file=sys.stderr)
        return 130
    except _UsageError as exc:
        return print_error(exc)
    except _Timeout:
        return print_error(f"{args.function} did not finish within --time-limit {args.time_limit:g} s")
    except _Crash as exc:
        sig = SIGNATURES[(args.level, "exact" if args.as_sampler else args.mode)]
        return print_error(
            f"{args.function} raised {exc} when called as {sig} at {args.level} level "
            f"(if it is not a {args.level} verifier: {OTHER_LEVEL[args.level]})"
        )
    except ConformanceError as exc:
        wrong_level = any(m in str(exc) for m in ("sequence of token ids", "BlockModel"))
        hint = f" ({OTHER_LEVEL['block']}?)" if args.level == "block" and wrong_level else ""
        return print_error(f"{args.function} broke the verifier contract: {exc}{hint}")
    except InvalidInputError as exc:
        return print_error(exc)
    except OSError as exc:
        return print_error(f"cannot write the report: {exc}")
    except Exception as exc:  # noqa: BLE001 — the contract of a command line: one line, never a traceback
        return print_error(f"{type(exc).__name__}: {exc}")
    try:
        print(result.summary())
        print(f"\nreport: {out / 'report.md'}, {out / 'report.json'}")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`| head`): the verdict stands, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())

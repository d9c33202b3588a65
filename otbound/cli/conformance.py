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

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from otbound._replay import MAX_BRANCHES
from otbound._validation import InvalidInputError
from otbound.cli._common import ExitStatus, OneLineParser, draft_law_names, print_error
from otbound.conformance import (
    ConformanceError,
    as_drafting,
    as_sampler,
    check_block_verifier,
    check_drafter_invariance,
    check_token_verifier,
    top_k_tree,
    violations_reraised,
)

PROG = "python -m otbound.conformance"

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


class _Timeout(BaseException):  # not an Exception: the verifier's own `except Exception` cannot swallow it
    pass


class _Crash(Exception):
    def __init__(self, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


def parser() -> OneLineParser:
    """The flags of ``python -m otbound.conformance``."""
    ap = OneLineParser(
        prog=PROG,
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
        choices=draft_law_names(),
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
        raise InvalidInputError(f"--drafting {spec}: {exc}") from None


def load(spec: str, need_callable: bool = True):
    """The object named by ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` (``InvalidInputError`` with
    one sentence if it is not there)."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise InvalidInputError(f"expected MODULE:FUNCTION or path/to/file.py:FUNCTION, got {spec!r}")
    if module.endswith(".py") or "/" in module or os.sep in module:
        path = Path(module)
        if not path.is_file():
            raise InvalidInputError(f"no such file {module!r}")
        name = f"_otbound_user_{path.stem}"
        sys.path.insert(0, str(path.resolve().parent))  # its own sibling imports
        try:
            spec_ = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec_)
            sys.modules[name] = mod
            spec_.loader.exec_module(mod)
        except Exception as exc:  # noqa: BLE001 — the user's file: report it in one line
            raise InvalidInputError(f"cannot import file {module!r}: {type(exc).__name__}: {exc}") from None
    else:
        if "" not in sys.path:
            sys.path.insert(0, "")  # a module in the current directory
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 — any import failure is the user's module's: report it in one line
            raise InvalidInputError(f"cannot import module {module!r}: {type(exc).__name__}: {exc}") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidInputError(f"{module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if need_callable and not callable(obj):
        raise InvalidInputError(f"{spec} is not callable")
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


@dataclasses.dataclass(frozen=True)
class ConformanceOptions:
    """The options of ``python -m otbound.conformance`` (one field per flag, named as its ``dest``;
    ``function`` is the ``MODULE:FUNCTION`` argument), validated when made: an
    :class:`~otbound.InvalidInputError` for a value out of range or an option that does not apply
    to the level and mode (an option silently ignored is an option misread). ``None`` means the
    default of the level (vocabulary, instances, block length) or mode.

    Examples
    --------
    >>> from otbound.cli.conformance import ConformanceOptions
    >>> ConformanceOptions("otbound.conformance.examples:rrs", level="token", num_drafts=2).mode
    'exact'
    >>> ConformanceOptions("otbound.conformance.examples:rrs", level="token", num_drafts=2, block_len=3)
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: --block-len applies to --level block only
    """

    function: str
    level: str
    num_drafts: int
    vocab_size: int | None = None
    block_len: int | None = None
    sampling: str | None = None
    drafting: str | None = None
    mode: str = "exact"
    drafter_invariance: bool = False
    batch: bool = False
    as_sampler: bool = False
    samples: int | None = None
    precision: str | None = None
    tolerance: float | None = None
    max_branches: int | None = None
    instances: int | None = None
    seed: int = 0
    time_limit: float = DEFAULT_TIME_LIMIT
    out: str = DEFAULT_OUT

    def __post_init__(self):
        for flag, value, choices in (("--level", self.level, ("token", "block")),
                                     ("--mode", self.mode, ("exact", "sample")),
                                     ("--sampling", self.sampling, (None, *draft_law_names())),
                                     ("--precision", self.precision, (None, "float64", "float32"))):
            if value not in choices:
                raise InvalidInputError(f"{flag} {value!r}: expected one of {', '.join(c for c in choices if c)}")
        if self.level == "token" and self.block_len is not None:
            raise InvalidInputError("--block-len applies to --level block only")
        if self.level == "token" and self.drafting is not None:
            raise InvalidInputError("--drafting applies to --level block only (token drafts follow --sampling)")
        if self.drafter_invariance and (self.level != "token" or self.mode != "exact" or self.sampling is not None):
            raise InvalidInputError("--drafter-invariance checks a token-level procedure on i.i.d. drafts: "
                                    "use --level token without --mode sample or --sampling")
        if self.level == "block" and self.sampling is not None:
            raise InvalidInputError("--sampling applies to --level token only (block drafts are K i.i.d. blocks)")
        if self.mode == "exact":
            for flag, given in (("--batch", self.batch), ("--as-sampler", self.as_sampler),
                                ("--samples", self.samples is not None)):  # fmt: skip
                if given:
                    raise InvalidInputError(f"{flag} applies to --mode sample only")
        else:
            for flag, given in (("--precision", self.precision), ("--tolerance", self.tolerance),
                                ("--max-branches", self.max_branches)):  # fmt: skip
                if given is not None:
                    raise InvalidInputError(f"{flag} applies to --mode exact only")
            if self.as_sampler and self.batch:
                raise InvalidInputError("--as-sampler runs a per-call coin/draw function; it cannot be combined with "
                                        "--batch")
        if self.precision is not None and self.tolerance is not None:
            raise InvalidInputError("give --precision or --tolerance, not both")
        if not self.time_limit > 0:
            raise InvalidInputError(f"--time-limit must be positive, got {self.time_limit:g}")
        if self.seed < 0:
            raise InvalidInputError(f"--seed must be non-negative, got {self.seed}")


def _check_signature(fn, o: ConformanceOptions) -> None:
    """The function must take the arguments the level and mode pass (5 with coin, draw; 4 with rng)."""
    n = 5 if o.mode == "exact" or o.as_sampler else 4
    ok = _takes(fn, n)
    if ok is not False:
        return
    want = SIGNATURES[(o.level, "exact" if o.as_sampler else o.mode)]
    other = _takes(fn, 9 - n)
    hint = ""
    if other and n == 4:
        hint = ": it takes 5 (… coin, draw), an exact-mode verifier: use --mode exact, or --as-sampler to sample it"
    elif other:
        hint = ": it takes 4 (… rng), a sample-mode verifier: use --mode sample"
    raise InvalidInputError(f"{o.function}{inspect.signature(fn)} cannot be called as {want}{hint}")


def _check_out(out: str) -> Path:
    """``out`` as a directory this process can write (created if absent), else ``InvalidInputError``."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InvalidInputError(f"--out {out!r} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise InvalidInputError(f"--out {out!r} is not a writable directory ({exc.strerror or exc})") from None
    return path


def _guarded(verify):
    """``verify`` whose own exceptions (not the kit's) become ``_Crash``, reported in one line; so
    does ``SystemExit`` (a verifier calling ``sys.exit(0)`` must not end the check as "lossless").
    After the call: a routing error the verifier caught, or a time limit it swallowed, is raised."""
    def call(*a):
        with violations_reraised():  # only this call's routing errors count
            try:
                out = verify(*a)
            except (ConformanceError, _Timeout, KeyboardInterrupt):
                raise
            except BaseException as exc:  # noqa: BLE001 — the user's code, sys.exit included: reported, never a traceback
                raise _Crash(exc) from None
            if _EXPIRED:
                raise _Timeout
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


def run(o: ConformanceOptions):
    """Check the function of ``o`` (:func:`~otbound.conformance.check_token_verifier`,
    :func:`~otbound.conformance.check_block_verifier` or
    :func:`~otbound.conformance.check_drafter_invariance`) under the time limit; returns ``(result,
    report folder)``."""
    verify = load(o.function)
    if o.drafter_invariance:
        if _takes(verify, 4) is False:
            raise InvalidInputError(f"{o.function}{inspect.signature(verify)} cannot be called as "
                              "procedure(p, q, num_drafts, rng) -> (drafts, token)")
        out = _check_out(o.out)
        with _time_limit(o.time_limit):
            result = check_drafter_invariance(
                _guarded(verify), vocab_size=DEFAULT_VOCAB["token"] if o.vocab_size is None else o.vocab_size,
                num_drafts=o.num_drafts, seed=o.seed, name=o.function,
                instances=DEFAULT_INSTANCES["token"] if o.instances is None else o.instances)
        return result, out
    _check_signature(verify, o)
    drafting = _drafting(o.drafting)
    if drafting == "top-k":
        drafting = top_k_tree(o.num_drafts)
    out = _check_out(o.out)
    if o.as_sampler:
        verify = as_sampler(verify)
    common = dict(
        num_drafts=o.num_drafts,
        instances=DEFAULT_INSTANCES[o.level] if o.instances is None else o.instances,
        seed=o.seed,
        mode=o.mode,
        name=o.function,
        vocab_size=DEFAULT_VOCAB[o.level] if o.vocab_size is None else o.vocab_size,
    )
    if o.mode == "exact":
        common.update(precision=o.precision or "float64", tolerance=o.tolerance,
                      max_branches=MAX_BRANCHES if o.max_branches is None else o.max_branches)  # fmt: skip
    else:
        common.update(batch=o.batch, samples=o.samples)
    limit = f"{o.function} did not finish within --time-limit {o.time_limit:g} s"
    with _time_limit(o.time_limit, limit):
        if o.level == "token":
            result = check_token_verifier(_guarded(verify), sampling=o.sampling or "with_replacement", **common)
        else:
            block_len = DEFAULT_BLOCK_LEN if o.block_len is None else o.block_len
            result = check_block_verifier(_guarded(verify), block_len=block_len, drafting=drafting, **common)
        if _EXPIRED:  # the limit passed while the kit's own code ran: the check is not complete
            raise _Timeout
    return result, out


def main(argv=None) -> int:
    """Run the command line; returns its exit status (:class:`~otbound.cli.ExitStatus`: 0 lossless, 1
    not lossless, 2 a usage or contract error in one line on stderr, 130 Ctrl-C)."""
    o = None
    try:
        o = ConformanceOptions(**vars(parser().parse_args(argv)))
        result, out = run(o)
        result.write(out)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; no verdict, no report written", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except _Timeout:
        return print_error(f"{o.function} did not finish within --time-limit {o.time_limit:g} s")
    except _Crash as exc:
        sig = SIGNATURES[(o.level, "exact" if o.as_sampler else o.mode)]
        return print_error(
            f"{o.function} raised {exc} when called as {sig} at {o.level} level "
            f"(if it is not a {o.level} verifier: {OTHER_LEVEL[o.level]})"
        )
    except ConformanceError as exc:
        wrong_level = any(m in str(exc) for m in ("sequence of token ids", "BlockModel"))
        hint = f" ({OTHER_LEVEL['block']}?)" if o.level == "block" and wrong_level else ""
        return print_error(f"{o.function} broke the verifier contract: {exc}{hint}")
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
    return ExitStatus.OK if result.passed else ExitStatus.FAILED


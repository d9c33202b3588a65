"""``python -m otbound.engine``: audit a serving engine's speculative decoding through its own API.

Modes (one of): ``--synthetic`` (a tiny random GGUF pair on a llama-server built here, minutes),
``--pair NAME`` (a registered pair's GGUF files on a llama-server built here), ``--url URL`` (a
running llama.cpp server, audited as it is configured; add ``--pair`` for the draft's laws, which
the prediction and the best alternative need). Writes ``engine.json``, ``engine.md`` and
``engine.png`` into ``--out``.

Bad input (an unknown pair, engine or setting, a URL with nothing listening, a server that dies
mid-run, a port in use, a build that fails) exits 2 with one line, and leaves no ``engine.json``.
"""

from __future__ import annotations

import argparse
import dataclasses

from otbound._integrity import FolderLockedError
from otbound._validation import InvalidInputError
from otbound.cli._common import OneLineParser, exit_error, interrupted, parse_options
from otbound.engine import EngineError, Sampling, run_audit
from otbound.lm import BuildError, HashMismatchError, ModelUnavailableError

PROG = "python -m otbound.engine"
ENGINES = ("llama.cpp",)
#: the longest error message printed (a server's reply can be long)
MAX_ERROR_CHARS = 800


def _config(text: str):
    try:
        kind, n_max, p_min = text.split(":")
        return kind, int(n_max), float(p_min)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TYPE:N_MAX:P_MIN (e.g. draft-simple:4:0.0), got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The options of ``python -m otbound.engine`` (one field per flag, named as its ``dest``),
    validated when made: a known engine, one mode, known sampling presets (an
    :class:`~otbound.InvalidInputError` on the first failure). ``config`` holds
    ``(type, n_max, p_min)`` triples, ``sampling`` ``NAME[@T]`` presets.

    Examples
    --------
    >>> from otbound.cli.engine import EngineOptions
    >>> [s.name for s in EngineOptions(synthetic=True, sampling=["qwen", "default@0.7"]).samplings()]
    ['qwen', 'default T=0.7']
    >>> EngineOptions(synthetic=True, pair="qwen2.5-coder")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: --synthetic uses its own tiny pair; drop --pair
    """

    synthetic: bool = False
    url: str | None = None
    pair: str | None = None
    engine: str = "llama.cpp"
    out: str = "otbound-engine"
    config: tuple[tuple[str, int, float], ...] | None = None
    sampling: tuple[str, ...] | None = None
    num_prompts: int = 4
    prompts: str = "humaneval"
    seeds: int = 3
    n_predict: int = 32
    lossless_samples: int = 1500
    lossless_depth: int = 3
    n_probs: int = 20
    seed: int = 0
    startup_timeout: float = 180.0
    quiet: bool = False

    def __post_init__(self):
        for name in ("config", "sampling"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.engine not in ENGINES:
            raise InvalidInputError(f"unknown engine {self.engine!r}; supported: {', '.join(ENGINES)}")
        if self.synthetic and self.url is not None:
            raise InvalidInputError("give one of --synthetic and --url, not both")
        if not self.synthetic and self.url is None and self.pair is None:
            raise InvalidInputError("choose --synthetic, --pair NAME or --url URL")
        if self.synthetic and self.pair is not None:
            raise InvalidInputError("--synthetic uses its own tiny pair; drop --pair")
        self.samplings()

    def samplings(self) -> list[Sampling] | None:
        """The sampling presets as :class:`~otbound.engine.Sampling` objects (None: the audit's default)."""
        if not self.sampling:
            return None
        out = []
        for v in self.sampling:
            name, _, t = v.partition("@")
            try:
                temperature = float(t) if t else None
            except ValueError:
                raise InvalidInputError(f"bad temperature in sampling {v!r}") from None
            out.append(Sampling.named(name, temperature))
        return out


def parser() -> OneLineParser:
    """The flags of ``python -m otbound.engine``."""
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--synthetic", action="store_true", help="the tiny GGUF pair on a local llama-server")
    mode.add_argument("--url", default=None, help="a running llama.cpp server (http://host:port)")
    ap.add_argument("--pair", default=None, help="a registered pair (otbound.lm.PAIRS), e.g. qwen2.5-coder")
    ap.add_argument("--engine", default="llama.cpp", help=f"the engine to build and run (one of {', '.join(ENGINES)})")
    ap.add_argument("--out", default="otbound-engine", help="output folder (default: ./otbound-engine)")
    ap.add_argument("--config", type=_config, action="append", default=None, metavar="TYPE:N_MAX:P_MIN",
                    help="a speculative configuration (repeatable; with --url: the one the server runs)")
    ap.add_argument("--sampling", action="append", default=None, metavar="NAME[@T]",
                    help="sampling preset: default@T (llama.cpp's chain at temperature T), qwen, topk4 (repeatable)")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--prompts", default="humaneval", help="prompt set of the real pair (humaneval, mtbench, JSONL)")
    ap.add_argument("--seeds", type=int, default=3, help="requests per prompt in the acceptance run")
    ap.add_argument("--n-predict", type=int, default=32, help="tokens per request in the acceptance run")
    ap.add_argument("--lossless-samples", type=int, default=1500)
    ap.add_argument("--lossless-depth", type=int, default=3,
                    help="tokens per lossless-test continuation (>= 3: fewer are never drafted)")
    ap.add_argument("--n-probs", type=int, default=20, help="tokens of each law asked for (the rest: one cell)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--quiet", action="store_true")
    return ap


def run(o: EngineOptions) -> dict:
    """The audit :func:`otbound.engine.run_audit` of ``o``; returns what it returns."""
    return run_audit(o.out, synthetic=o.synthetic, url=o.url, pair=o.pair,
                     configs=None if o.config is None else list(o.config), samplings=o.samplings(),
                     num_prompts=o.num_prompts, seeds_per_prompt=o.seeds, n_predict=o.n_predict,
                     lossless_samples=o.lossless_samples, lossless_depth=o.lossless_depth, n_probs=o.n_probs,
                     prompt_source=o.prompts, seed=o.seed, progress=not o.quiet, startup_timeout=o.startup_timeout)


def main(argv=None) -> dict:
    """Run the command line: bad input ends in one line on stderr and exit status 2; Ctrl-C in one
    line and status 130, every server it started stopped."""
    options = parse_options(parser(), argv, EngineOptions)
    try:
        return run(options)
    except (InvalidInputError, EngineError, BuildError, ModelUnavailableError, HashMismatchError,
            FolderLockedError) as exc:
        exit_error(" ".join(str(exc).split())[:MAX_ERROR_CHARS], PROG)
    except KeyboardInterrupt:
        interrupted(f"{PROG}: interrupted (every server it started is stopped)")

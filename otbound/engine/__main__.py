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
import sys

from otbound._integrity import FolderLockedError
from otbound._validation import InvalidInputError
from otbound.engine._client import EngineError
from otbound.engine._laws import Sampling
from otbound.engine._run import run_audit
from otbound.lm import BuildError, HashMismatchError, ModelUnavailableError

PROG = "python -m otbound.engine"
ENGINES = ("llama.cpp",)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _config(text: str):
    try:
        kind, n_max, p_min = text.split(":")
        return kind, int(n_max), float(p_min)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TYPE:N_MAX:P_MIN (e.g. draft-simple:4:0.0), got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--lossless-depth", type=int, default=3, help="tokens per continuation of the lossless test")
    ap.add_argument("--n-probs", type=int, default=20, help="tokens of each law asked for (the rest: one cell)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--quiet", action="store_true")
    return ap


def _samplings(values):
    if not values:
        return None
    out = []
    for v in values:
        name, _, t = v.partition("@")
        try:
            temperature = float(t) if t else None
        except ValueError:
            raise InvalidInputError(f"bad temperature in sampling {v!r}") from None
        out.append(Sampling.named(name, temperature))
    return out


def run(args) -> dict:
    if args.engine not in ENGINES:
        raise InvalidInputError(f"unknown engine {args.engine!r}; supported: {', '.join(ENGINES)}")
    if not args.synthetic and args.url is None and args.pair is None:
        raise InvalidInputError("choose --synthetic, --pair NAME or --url URL")
    if args.synthetic and args.pair is not None:
        raise InvalidInputError("--synthetic uses its own tiny pair; drop --pair")
    return run_audit(args.out, synthetic=args.synthetic, url=args.url, pair=args.pair, configs=args.config,
                     samplings=_samplings(args.sampling), num_prompts=args.num_prompts, seeds_per_prompt=args.seeds,
                     n_predict=args.n_predict, lossless_samples=args.lossless_samples,
                     lossless_depth=args.lossless_depth, n_probs=args.n_probs, prompt_source=args.prompts,
                     seed=args.seed, progress=not args.quiet, startup_timeout=args.startup_timeout)


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except (InvalidInputError, EngineError, BuildError, ModelUnavailableError, HashMismatchError,
            FolderLockedError) as exc:
        text = " ".join(str(exc).split())
        print(f"{PROG}: error: {text[:800]}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (every server it started is stopped)", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()

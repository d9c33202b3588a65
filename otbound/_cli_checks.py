"""Flag checking for ``python -m otbound.compare``: every flag is validated before any work.

Per-flag checks are argparse ``type=`` functions (a bad value ends the run before anything is
computed or written); the checks that involve several flags or the file system are in
:func:`check_args`. Any failure exits with status 2 and one line ``python -m otbound.compare:
error: ...`` (:class:`Parser`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


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


def temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite temperature > 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Cross-flag and file-system checks (``parser.error`` on the first failure); fills the
    effective defaults (K, T, sample counts) into ``args`` so that the report records them."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {args.out!r} is an existing file, not a folder")
    parent = next((a for a in [out, *out.parents] if a.exists()), Path("."))
    if not parent.is_dir() or not _writable(parent):
        parser.error(f"--out {args.out!r}: {str(parent)!r} is not a writable folder")
    synthetic = args.synthetic
    args.num_drafts = args.num_drafts or ([1, 2, 4, 8] if synthetic else [2, 3, 4])
    args.temperature = args.temperature or ([0.7, 1.0, 1.5] if synthetic else [0.7, 1.0])
    args.block_mc_samples = 20_000 if args.mc_samples is None else args.mc_samples
    if args.mc_samples is None:
        args.mc_samples = 20_000 if synthetic else 16
    if synthetic and max(args.num_drafts) > args.vocab_size:
        parser.error(f"--num-drafts {max(args.num_drafts)} exceeds --vocab-size {args.vocab_size}: "
                     "the draft laws without replacement need K distinct tokens")
    if not synthetic:
        from otbound.lm import DATASETS, PAIRS

        for d in args.datasets:
            if d not in DATASETS and not Path(d).is_file():
                parser.error(f"--datasets {d!r} is neither a shipped set ({', '.join(DATASETS)}) nor a JSONL file")
        if "," not in args.pair and args.pair not in PAIRS:
            parser.error(f"--pair {args.pair!r} is not a registered pair ({', '.join(sorted(PAIRS))}) "
                         "nor 'DRAFT,TARGET'")
        if len(args.pair.split(",")) > 2 or any(not s for s in args.pair.split(",")):
            parser.error(f"--pair {args.pair!r}: expected a registered name or 'DRAFT,TARGET'")
    if args.block:
        _check_block_size(parser, args)
    return args


def _check_block_size(parser, args) -> None:
    """The block section's exact objects, estimated before any work: the draft trie and the LP."""
    from otbound._block_lp import MAX_SPLIT_VARIABLES
    from otbound._block_tree import MAX_TREE_CELLS

    v, length, k = args.block_vocab, max(args.block_lens), max(args.block_drafts)
    cells = sum(v**d for d in range(length + 1)) * v
    if cells > MAX_TREE_CELLS:
        parser.error(f"--block-vocab {v} --block-lens {length}: the draft trie needs {cells} cells per law "
                     f"(limit {MAX_TREE_CELLS}); lower them")
    split = (k - 1) * v ** (2 * length)
    if split > MAX_SPLIT_VARIABLES:
        parser.error(f"--block-drafts {k} --block-lens {length} --block-vocab {v}: the exact block LP needs "
                     f"{split} split variables (limit {MAX_SPLIT_VARIABLES}); lower them")


def effective_settings(args) -> dict:
    """The settings the run actually used, for the report's meta."""
    out = {"num_drafts": list(args.num_drafts), "temperatures": list(args.temperature),
           "mc_samples": args.mc_samples, "seed": args.seed}
    if args.block:
        out.update(block_drafts=list(args.block_drafts), block_lens=list(args.block_lens),
                   block_vocab=args.block_vocab, block_mc_samples=args.block_mc_samples)
    return out


def _writable(folder: Path) -> bool:
    import os

    return os.access(folder, os.W_OK | os.X_OK)

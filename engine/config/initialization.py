"""The initializer's contract with the operator: what it fetched into the job's cache, or why not.

On a cluster, one initializer pod (`kuberl initialize`) downloads every hub repository a job names
into the cache volume before any trainer pod starts; the trainer pods then read the cache offline.
The initializer writes an InitializationReport as JSON to its container's termination message, the
operator reads it from the pod's status (operator/control/reconcile.py) with this same model, and copies it
into the RLJob's status. The engine never imports the operator; both import this.
"""

from __future__ import annotations

from pydantic import Field

from .base import SpecModel
from .model import WeightsSource
from .topology import EngineConfig

# A failure that retrying cannot mend (no such repository, a refused token, a full volume): the
# initializer exits with this code and its Job fails at once instead of retrying.
PERMANENT_FAILURE_EXIT_CODE = 3
# Kubernetes keeps at most this much of a container's termination message.
TERMINATION_MESSAGE_LIMIT = 4096

InitializationReason = str
"""A CamelCase word: RepositoryNotFound, RevisionNotFound, TokenRefused, CacheVolumeFull,
HubUnreachable, DownloadFailed, UnsupportedModel."""


class FetchedRepo(SpecModel):
    """One hub repository in the cache."""

    field: str = Field(max_length=64)
    """The spec field that names it: model, tokenizer or reward.model."""
    repo: str = Field(max_length=256)
    """The hub repository id."""
    revision: str | None = Field(default=None, max_length=256)
    """As the spec asks for it (a branch, tag or commit; none: the default branch)."""
    commit: str = Field(max_length=64)
    """The commit it resolved to: the trainer pods load exactly this one."""
    files: int = Field(default=0, ge=0)
    """Files in the snapshot."""
    bytes: int = Field(default=0, ge=0)
    """The size of the whole snapshot."""
    fetched_bytes: int = Field(default=0, ge=0)
    """Downloaded by this initializer; 0 when the cache held everything already."""


class InitializationReport(SpecModel):
    """What one initializer run did: every repository fetched, or the reason it stopped."""

    repos: list[FetchedRepo] = Field(default=[], max_length=8)
    reason: InitializationReason | None = Field(default=None, max_length=64)
    """None on success."""
    message: str | None = Field(default=None, max_length=1024)
    """For people: what failed and how to fix it."""

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def fetched_bytes(self) -> int:
        return sum(r.fetched_bytes for r in self.repos)

    def to_json(self) -> str:
        text = self.model_dump_json(by_alias=True, exclude_none=True)
        assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT, "the report outgrew the termination message"
        return text


def hub_sources(config: EngineConfig) -> list[tuple[str, WeightsSource]]:
    """Every weights source of a job that names a hub repository, with its spec field."""
    candidates: list[tuple[str, WeightsSource | None]] = [
        ("model", config.model),
        ("tokenizer", config.tokenizer),
        ("reward.model", config.reward.model if config.reward is not None else None),
    ]
    return [(field, source) for field, source in candidates if source is not None and source.hub_id is not None]

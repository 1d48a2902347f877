"""The registry of experiment trackers: one backend, one file, one `@register_tracker`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ..common.registry import Registry
from ..config.tracking import TrackingSpec


@dataclass(frozen=True)
class TrackerContext:
    """What a backend is opened with."""

    job: str
    run_dir: Path
    """The run's folder (the checkpoint volume in a pod): where local event files go."""
    params: dict[str, str]
    """The resolved job config, flattened to dotted names (credentials are references only)."""
    run_id: str | None = None
    """The backend's run id of an earlier attempt of this job: continue that run."""
    resumed_at: int = 0
    """The last step already done (a resumed job's checkpoint), 0 for a new run."""
    env: dict[str, str] = field(default_factory=dict)


class Tracker(Protocol):
    run_id: str
    """What a resumed job needs to continue this run (kept in the checkpoint folder)."""

    def log(self, step: int, scalars: dict[str, float]) -> None: ...
    def artifact(self, path: Path) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class TrackerEntry:
    backend: str
    module: str
    """The package the backend imports (checked at start)."""
    extra: str
    """The pip extra of kuberl that installs it."""
    open: Callable[[TrackingSpec, TrackerContext], Tracker]


TRACKERS: Registry[TrackerEntry] = Registry("tracking backend")


def register_tracker(backend: str, *, module: str, extra: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(open_fn: Callable[[TrackingSpec, TrackerContext], Tracker]) -> Callable[..., Any]:
        TRACKERS[backend] = TrackerEntry(backend, module, extra, open_fn)
        return open_fn

    return register

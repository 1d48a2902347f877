"""All of a job's trackers behind one object: opened at start (continuing an earlier attempt's
runs), fed every step's record, given the reward curve at the end. A backend that fails is
reported once and dropped: tracking never stops training."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from ..config.termination import NotRetryable
from ..config.tracking import TrackingSpec
from .grouping import tracked_scalars
from .registry import TRACKERS, Tracker, TrackerContext

log = logging.getLogger("kuberl.engine")

RUN_IDS_FILE = "tracking.json"


class TrackingError(NotRetryable, ValueError):
    """A tracker the job names cannot run here; the message names the field and the extra to install."""

    reason = "InvalidConfig"


def check_available(specs: list[TrackingSpec]) -> None:
    """Refuse a backend whose package is not installed, before any model loads."""
    from . import mlflow_tracker, tensorboard_tracker, wandb_tracker  # noqa: F401  (register the backends)

    for index, spec in enumerate(specs):
        entry = TRACKERS[spec.backend]
        try:
            found = importlib.util.find_spec(entry.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise TrackingError(
                f"monitoring.tracking[{index}].backend: {spec.backend} needs the {entry.module} package, "
                f"which is not installed: pip install 'kuberl[{entry.extra}]'"
            )


class Trackers:
    def __init__(self, specs: list[TrackingSpec], *, job: str, run_dir: Path, ids_dir: Path, params: dict[str, str], resumed_at: int):
        """`ids_dir`: where the runs' ids are kept between attempts (the checkpoint folder)."""
        check_available(specs)
        self.ids_file = ids_dir / RUN_IDS_FILE
        known = json.loads(self.ids_file.read_text()) if self.ids_file.exists() else {}
        self.active: dict[str, Tracker] = {}
        for spec in specs:
            ctx = TrackerContext(job=job, run_dir=run_dir, params=params, run_id=known.get(spec.backend), resumed_at=resumed_at)
            tracker = self._guard(spec.backend, "start", lambda: TRACKERS[spec.backend].open(spec, ctx))
            if tracker is not None:
                self.active[spec.backend] = tracker
                log.info("tracking: %s run %s (%s)", spec.backend, tracker.run_id, "new" if ctx.run_id is None else "continued")
        self._save_ids({**known, **{b: t.run_id for b, t in self.active.items()}})

    def log(self, record: Mapping[str, Any]) -> None:
        scalars = tracked_scalars(record)
        step = int(record.get("step", 0))
        for backend, tracker in list(self.active.items()):
            self._guard(backend, "log", lambda: tracker.log(step, scalars))

    def artifact(self, path: Path) -> None:
        for backend, tracker in list(self.active.items()):
            self._guard(backend, "artifact", lambda: tracker.artifact(path))

    def close(self) -> None:
        for backend, tracker in list(self.active.items()):
            self._guard(backend, "close", tracker.close)
        self.active.clear()

    def _guard(self, backend: str, what: str, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:  # a tracker's server down, a full disk: a warning, not a failed job
            log.warning(
                "tracking: %s failed at %s (%s: %s); training goes on without it", backend, what, type(exc).__name__, str(exc)[:300]
            )
            self.active.pop(backend, None)
            return None

    def _save_ids(self, ids: dict[str, str]) -> None:
        self.ids_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.ids_file.with_suffix(".partial")
        partial.write_text(json.dumps(ids, indent=1))
        os.replace(partial, self.ids_file)

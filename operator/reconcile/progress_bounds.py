"""The bounds a progress report must keep before any of it enters the RLJob's status. Pure.

The report comes from the job's progress ConfigMap, which the controller rank writes with the job's
ServiceAccount token: whatever runs in that pod (a tool, a compromised dependency) can write it too.
What it writes goes into the RLJob's status, which every reader of the RLJob (kubectl, dashboards,
the job commands) shows, and which the API server stores: a string of a megabyte, an integer past
int64 or an infinite float would bloat or break every status write of the job. So a report is read
only when it is small and every number and string in it lies within the bounds below; otherwise it is
refused whole and the status keeps its last good numbers.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from pydantic import ValidationError

from kuberl.engine.config import ProgressReport

MAX_REPORT_BYTES = 4096
"""A genuine report is a few hundred bytes (ProgressReport.to_json)."""
MAX_STEPS = 10**9
"""Steps, total steps and checkpoint steps: far beyond any training run, far within int64."""
MAX_ABS_METRIC = 1e12
"""Reward and KL means: any real value is orders of magnitude smaller."""
MAX_TOKENS_PER_SECOND = 1e12
MAX_ETA_SECONDS = 10 * 365 * 24 * 3600
MAX_PATH_CHARS = 1024
EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)


class OutOfBounds(ValueError):
    """A report the operator refuses, and why (for the log)."""


def _within(name: str, value: float | int | None, low: float, high: float) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise OutOfBounds(f"{name} is {value}, not a finite number")
    if not low <= value <= high:
        raise OutOfBounds(f"{name} is {value}, outside [{low:g}, {high:g}]")


def bounded_report(raw: str) -> ProgressReport:
    """The report in `raw` when it keeps every bound; OutOfBounds (or pydantic's ValidationError for a report
    that is not one: unknown keys, wrong types) otherwise."""
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_REPORT_BYTES:
        raise OutOfBounds(f"the report is {size} bytes, more than {MAX_REPORT_BYTES}")
    report = ProgressReport.model_validate_json(raw)
    for name in ("step", "total_steps", "validation_step"):
        _within(name, getattr(report, name), 0, MAX_STEPS)
    for name in ("reward_mean", "kl", "validation_reward_mean"):
        _within(name, getattr(report, name), -MAX_ABS_METRIC, MAX_ABS_METRIC)
    _within("tokens_per_second", report.tokens_per_second, 0, MAX_TOKENS_PER_SECOND)
    _within("eta_seconds", report.eta_seconds, 0, MAX_ETA_SECONDS)
    checkpoint = report.last_checkpoint
    if checkpoint is not None:
        _within("last_checkpoint.step", checkpoint.step, 0, MAX_STEPS)
        path = checkpoint.path
        if not 0 < len(path) <= MAX_PATH_CHARS or not path.isprintable():
            raise OutOfBounds(f"last_checkpoint.path has {len(path)} characters (at most {MAX_PATH_CHARS}, printable ones)")
        when = checkpoint.time
        if when is not None:
            aware = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
            if not EARLIEST <= aware <= LATEST:
                raise OutOfBounds(f"last_checkpoint.time is {when.isoformat()}, outside {EARLIEST.year}-{LATEST.year}")
    return report


def read_report(raw: str | None) -> ProgressReport | None:
    """The report to copy into the status, or None: nothing written yet, half written, foreign or out of bounds."""
    if not raw:
        return None
    try:
        return bounded_report(raw)
    except (OutOfBounds, ValidationError, ValueError):
        return None

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
import re
from datetime import datetime, timezone

from pydantic import ValidationError

from kuberl.engine.config import CheckpointStatus, ProgressReport

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


MAX_REFUSAL_CHARS = 256
"""The longest refusal message (a Warning event on the RLJob)."""
_ERROR_TYPE = re.compile(r"^[a-z_]{1,64}$")
_KNOWN_KEYS = frozenset(
    k for model in (ProgressReport, CheckpointStatus) for name, f in model.model_fields.items() for k in (name, f.alias) if k
)


class OutOfBounds(ValueError):
    """A report the operator refuses: the detail with the value (for tests and the log), and `bound`, the bound
    it broke without the value (for the event: what the report's writer chose never goes out unbounded)."""

    def __init__(self, detail: str, bound: str):
        super().__init__(detail)
        self.bound = bound


def _within(name: str, value: float | int | None, low: float, high: float) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise OutOfBounds(f"{name} is {value}, not a finite number", f"{name} is not a finite number")
    if not low <= value <= high:
        raise OutOfBounds(f"{name} is {value}, outside [{low:g}, {high:g}]", f"{name} is outside [{low:g}, {high:g}]")


def bounded_report(raw: str) -> ProgressReport:
    """The report in `raw` when it keeps every bound; OutOfBounds (or pydantic's ValidationError for a report
    that is not one: unknown keys, wrong types) otherwise."""
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_REPORT_BYTES:
        raise OutOfBounds(f"the report is {size} bytes, more than {MAX_REPORT_BYTES}", f"the report is more than {MAX_REPORT_BYTES} bytes")
    report = ProgressReport.model_validate_json(raw)
    for name in ("step", "total_steps", "validation_step", "staleness"):
        _within(name, getattr(report, name), 0, MAX_STEPS)
    for name in ("reward_mean", "kl", "validation_reward_mean"):
        _within(name, getattr(report, name), -MAX_ABS_METRIC, MAX_ABS_METRIC)
    _within("tokens_per_second", report.tokens_per_second, 0, MAX_TOKENS_PER_SECOND)
    for name in ("trainer_idle_fraction", "rollout_idle_fraction"):
        _within(name, getattr(report, name), 0, 1)
    _within("eta_seconds", report.eta_seconds, 0, MAX_ETA_SECONDS)
    checkpoint = report.last_checkpoint
    if checkpoint is not None:
        _within("last_checkpoint.step", checkpoint.step, 0, MAX_STEPS)
        path = checkpoint.path
        if not 0 < len(path) <= MAX_PATH_CHARS or not path.isprintable():
            raise OutOfBounds(
                f"last_checkpoint.path has {len(path)} characters (at most {MAX_PATH_CHARS}, printable ones)",
                f"last_checkpoint.path is empty, longer than {MAX_PATH_CHARS} characters or not printable",
            )
        when = checkpoint.time
        if when is not None:
            aware = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
            if not EARLIEST <= aware <= LATEST:
                raise OutOfBounds(
                    f"last_checkpoint.time is {when.isoformat()}, outside {EARLIEST.year}-{LATEST.year}",
                    f"last_checkpoint.time is outside {EARLIEST.year}-{LATEST.year}",
                )
    return report


def _not_a_report(exc: ValidationError) -> str:
    """What is wrong with a report that is not one, naming only keys of the report's own schema and pydantic's
    error types: the unknown keys a writer chose are not repeated."""
    errors = exc.errors()
    if not errors:
        return "not a progress report"
    first = errors[0]
    where = ".".join(str(p) if isinstance(p, int) or p in _KNOWN_KEYS else "(an unknown key)" for p in first["loc"])
    kind = first["type"] if _ERROR_TYPE.match(first["type"]) else "invalid"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"not a progress report: {where or 'the document'}: {kind}{more}"


def check_report(raw: str | None) -> tuple[ProgressReport | None, str | None]:
    """(the report to copy into the status, or None; why it was refused, or None). Nothing written yet is
    no refusal; a report out of bounds, foreign or not JSON is, in at most MAX_REFUSAL_CHARS characters that
    name the broken bound and never the value."""
    if not raw:
        return None, None
    try:
        return bounded_report(raw), None
    except OutOfBounds as exc:
        why = exc.bound
    except ValidationError as exc:
        why = _not_a_report(exc)
    except ValueError:
        why = "not a progress report"
    return None, f"progress report refused, the status keeps its last good numbers: {why}"[:MAX_REFUSAL_CHARS]


def read_report(raw: str | None) -> ProgressReport | None:
    """The report to copy into the status, or None: nothing written yet, half written, foreign or out of bounds."""
    return check_report(raw)[0]


PROGRESS_REFUSED = "ProgressRefused"
"""The reason of the Warning event that says a report was refused."""
MAX_REFUSALS_REPORTED = 16
"""Distinct refusals reported per job (by one operator process): a writer that varies its reports gets no more."""


def report_refusal(seen: frozenset[str], refused: str | None) -> frozenset[str] | None:
    """The refusals reported once `refused` is: None when it is not to be reported (nothing refused, that one
    reported already, or MAX_REFUSALS_REPORTED reported) so that a report refused at every reconcile makes one
    event, not one per reconcile."""
    if refused is None or refused in seen or len(seen) >= MAX_REFUSALS_REPORTED:
        return None
    return seen | {refused}

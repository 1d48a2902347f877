"""What the initializer says when it ends: its report to the termination log, a line for people, its exit code."""

from __future__ import annotations

import logging

from ..common.termination_log import write_termination_message
from ..config.initialization import PERMANENT_FAILURE_EXIT_CODE, TERMINATION_MESSAGE_LIMIT, InitializationReport
from .failures import RETRIED_REASONS

log = logging.getLogger("kuberl.initializer")

MESSAGE_LIMIT = 1024  # InitializationReport.message's bound


def exit_code(report: InitializationReport) -> int:
    """0 on success; PERMANENT_FAILURE_EXIT_CODE where retrying cannot help, so the Job fails at once; else 1."""
    if report.ok:
        return 0
    return 1 if report.reason in RETRIED_REASONS else PERMANENT_FAILURE_EXIT_CODE


def finish(report: InitializationReport) -> None:
    """The report to the termination log (for the operator), a line for people on stdout."""
    write_termination_message(fit_report(report))
    print(summary(report), flush=True)


def fit_report(report: InitializationReport) -> str:
    """The report as JSON within the termination message's limit: the message gives way if needed."""
    while True:
        text = report.model_dump_json(by_alias=True, exclude_none=True)
        if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT or not report.message:
            return report.to_json()
        shorter = len(report.message) * 3 // 4
        report = report.model_copy(update={"message": clip(report.message, shorter) if shorter >= 16 else None})


def summary(report: InitializationReport) -> str:
    if not report.ok:
        return f"kuberl initialize failed ({report.reason}): {report.message}"
    repos = ", ".join(f"{r.field} {r.repo}@{r.commit[:12]} ({r.files} files, {human_bytes(r.bytes)})" for r in report.repos)
    count = f"{len(report.repos)} {'repository' if len(report.repos) == 1 else 'repositories'}"
    return f"kuberl initialize: {count} in the cache, {human_bytes(report.fetched_bytes)} downloaded" + (f": {repos}" if repos else "")


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"

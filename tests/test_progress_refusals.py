"""A refused progress report leaves a trace: the decision says which bound it broke, in a bounded message
that never repeats what the report's writer chose (its numbers, its keys), and the controller records it
as one Warning event per distinct refusal, not one per reconcile. Pure."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kuberl.operator.api import RLJobStatus
from kuberl.operator.validation.manifest import load_rljobs
from kuberl.operator.control.reconcile import Observed, decide
from kuberl.operator.control.reconcile.progress_bounds import MAX_REFUSAL_CHARS, MAX_REFUSALS_REPORTED, check_report, report_refusal

EXAMPLES = Path(__file__).parent.parent / "examples"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
GOOD = {"step": 7, "totalSteps": 10, "rewardMean": 0.625, "lastCheckpoint": {"step": 5, "path": "/checkpoints/step-5"}}
MARK = "424242424242"  # in every hostile value and key below: it must never reach the message
HOSTILE = {
    "step-past-bound": ({**GOOD, "step": int(MARK)}, "step is outside"),
    "huge-reward": ({**GOOD, "rewardMean": float(MARK + "e200")}, "reward_mean is outside"),
    "nan-kl": ({**GOOD, "kl": float("nan")}, "kl: finite_number"),
    "long-path": ({**GOOD, "lastCheckpoint": {"step": 5, "path": "/" + MARK * 100}}, "last_checkpoint.path"),
    "control-characters-in-path": ({**GOOD, "lastCheckpoint": {"step": 5, "path": f"/c\x1b[2J{MARK}"}}, "not printable"),
    "year-9999": ({**GOOD, "lastCheckpoint": {"step": 5, "path": "/c", "time": "9999-12-31T23:59:59Z"}}, "last_checkpoint.time"),
    "unknown-keys": ({**GOOD, f"evil{MARK}" + "k" * 200: 1}, "(an unknown key)"),
    "wrong-type": ({**GOOD, "step": f"x{MARK}"}, "step: int_parsing"),
    "oversized": ({**GOOD, "pad": MARK * 1000}, "more than 4096 bytes"),
}


def ppo():
    job = load_rljobs(EXAMPLES / "ppo-cluster" / "rljob.yaml")[0]
    job.metadata.namespace = "ns"
    job.status = RLJobStatus()
    return job


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_refusal_names_the_bound_and_never_the_value(name: str) -> None:
    report, words = HOSTILE[name]
    refused = decide(ppo(), Observed(progress=json.dumps(report, allow_nan=True)), NOW).progress_refused
    assert refused is not None and words in refused and refused.startswith("progress report refused")
    assert MARK not in refused and len(refused) <= MAX_REFUSAL_CHARS and refused.isprintable()


def test_not_json_is_a_refusal_and_nothing_written_is_none() -> None:
    assert "json_invalid" in (check_report("{half")[1] or "")
    assert decide(ppo(), Observed(progress=None), NOW).progress_refused is None
    assert decide(ppo(), Observed(progress=""), NOW).progress_refused is None
    assert decide(ppo(), Observed(progress=json.dumps(GOOD)), NOW).progress_refused is None


def test_each_distinct_refusal_is_reported_once() -> None:
    seen: frozenset[str] = frozenset()
    first = report_refusal(seen, "a")
    assert first == {"a"}
    assert report_refusal(first, "a") is None  # the same report at the next reconcile: no second event
    assert report_refusal(first, "b") == {"a", "b"}
    assert report_refusal(first, None) is None


def test_a_writer_that_varies_its_refusals_gets_a_bounded_number_of_events() -> None:
    seen: frozenset[str] = frozenset()
    reported = 0
    for i in range(10 * MAX_REFUSALS_REPORTED):
        after = report_refusal(seen, f"refusal {i}")
        if after is not None:
            seen, reported = after, reported + 1
    assert reported == MAX_REFUSALS_REPORTED

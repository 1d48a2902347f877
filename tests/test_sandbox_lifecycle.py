"""A job's sandbox pods live only while it may run: a finished or suspended job's decision deletes the
sandbox Deployment, whatever policy decided, and the plan of a suspended job leaves it out (so that
re-applying the support objects does not bring it back); resuming makes it again. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.operator.api import RLJob, RLJobStatus
from kuberl.operator.api.status import InitializationStatus
from kuberl.operator.control.children import OperatorSettings
from kuberl.operator.validation.manifest import parse_rljob
from kuberl.operator.control.planner import plan
from kuberl.operator.control.reconcile import Observed, decide
from kuberl.operator.control.reconcile.sandbox import sandbox_deletions

EXAMPLE = Path(__file__).parent.parent / "examples" / "ppo-cluster" / "rljob.yaml"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
SETTINGS = OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0")
SANDBOX = "deployment/ppo-qwen-math-sandbox"


def job(phase: str | None = None, tools: list[dict[str, Any]] | None = None, **run_policy: Any) -> RLJob:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["rollout"]["multiTurn"] = {"tools": tools if tools is not None else [{"name": "python"}], "maxTotalTokens": 1024}
    doc["metadata"]["namespace"] = "rl"
    j = parse_rljob(doc, "rljob.yaml")
    for key, value in run_policy.items():
        setattr(j.spec.run_policy, key, value)
    j.status = RLJobStatus(
        phase=phase,
        start_time=NOW - timedelta(seconds=10) if phase else None,
        completion_time=NOW if phase in ("Succeeded", "Failed") else None,
        initialization=InitializationStatus(completion_time=NOW) if phase else None,
    )  # the cache is filled
    return j


def jobset(*conditions: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "ppo-qwen-math", "uid": "js-1", "annotations": {}},
        "spec": {},
        "status": {"restarts": 0, "conditions": [{"type": c, "status": "True", "message": c} for c in conditions]},
    }


@pytest.mark.parametrize(
    "phase,suspend,deleted",
    [
        ("Succeeded", False, True),
        ("Failed", False, True),
        ("Running", True, True),
        ("Suspended", True, True),
        ("Running", False, False),
        ("Pending", False, False),
        ("Restarting", False, False),
        (None, False, False),
    ],
)
def test_the_sandbox_goes_exactly_when_the_job_stops(phase: str | None, suspend: bool, deleted: bool) -> None:
    assert sandbox_deletions(job(suspend=suspend), phase) == ((SANDBOX,) if deleted else ())


def test_a_job_without_sandbox_pods_deletes_none() -> None:
    assert sandbox_deletions(job(tools=[{"name": "calculator"}]), "Succeeded") == ()


def test_the_reconcile_that_finishes_the_job_deletes_its_sandbox() -> None:
    d = decide(job("Running"), Observed(jobsets=[jobset("Completed")]), NOW)
    assert d.status.phase == "Succeeded" and SANDBOX in d.delete
    d = decide(job("Running"), Observed(jobsets=[jobset("Failed")]), NOW)
    assert d.status.phase == "Failed" and d.delete == ("jobset/ppo-qwen-math", SANDBOX)
    # And every later one (level-based: an operator that restarted in between still removes it).
    assert SANDBOX in decide(job("Succeeded"), Observed(), NOW).delete


def test_suspending_deletes_it_and_the_plan_leaves_it_out_until_resumed() -> None:
    suspended = job("Running", suspend=True)
    d = decide(suspended, Observed(jobsets=[jobset()]), NOW)
    assert d.status.phase == "Suspended" and d.delete == ("jobset/ppo-qwen-math", SANDBOX)
    kinds = {o["kind"] for o in plan(suspended, uid="u", settings=SETTINGS).support if o["metadata"]["name"] == "ppo-qwen-math-sandbox"}
    assert kinds == {"Service", "NetworkPolicy"}
    resumed = job("Suspended")
    d = decide(resumed, Observed(), NOW)
    assert d.create_jobset and SANDBOX not in d.delete
    kinds = {o["kind"] for o in plan(resumed, uid="u", settings=SETTINGS).support if o["metadata"]["name"] == "ppo-qwen-math-sandbox"}
    assert kinds == {"Deployment", "Service", "NetworkPolicy"}

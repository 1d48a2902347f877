"""The API models' own behaviour: defaults, derived values, rule aggregation and status round trips."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from kuberl.engine.config import AlgorithmSpec, DatasetSource, ModelSpec, ParallelLayout
from kuberl.operator.api import RLJobStatus, Roles
from kuberl.operator.validation.manifest import ManifestError, parse_rljob


def test_roles_default_layout_is_all_data_parallel_and_colocated_roles_share_actor_ranks() -> None:
    roles = Roles.model_validate(
        {"actor": {"replicas": 2, "gpusPerReplica": 4}, "ref": {"colocateWith": "actor"}, "critic": {"replicas": 3}}
    )
    assert roles.ranks("actor") == 8
    assert roles.ranks("ref") == 8
    assert roles.ranks("critic") == 3
    assert roles.layout("actor") == ParallelLayout(dp=8)
    assert roles.layout("ref").dp == 8
    assert list(roles.present()) == ["actor", "critic", "ref"]


def test_cpu_role_has_one_rank_per_pod() -> None:
    roles = Roles.model_validate({"actor": {"replicas": 3, "gpusPerReplica": 0}})
    assert roles.ranks("actor") == 3


@pytest.mark.parametrize(
    ("path", "fmt"),
    [("a.jsonl", "jsonl"), ("a.json", "jsonl"), ("x/y.parquet", "parquet"), ("a.csv", None)],
)
def test_dataset_format_is_inferred_from_the_suffix(path: str, fmt: str | None) -> None:
    assert DatasetSource.model_construct(path=path, format=None, generator=None).inferred_format() == fmt


def test_algorithm_needs() -> None:
    assert AlgorithmSpec(name="dpo").needs_reference
    assert not AlgorithmSpec(name="grpo").needs_reference
    assert AlgorithmSpec(name="grpo", kl_coef=0.01).needs_reference
    assert AlgorithmSpec(name="ppo").needs_critic and not AlgorithmSpec(name="rloo").needs_critic


def test_every_broken_rule_of_a_section_is_reported() -> None:
    with pytest.raises(Exception) as caught:
        ModelSpec.model_validate({"path": "/m", "revision": "main", "tokenSecretRef": {"name": "s", "key": "k"}})
    problems = caught.value.errors()[0]["ctx"]["problems"]
    assert [p["field"] for p in problems] == ["revision", "tokenSecretRef"]


def test_manifest_form_leaves_unset_fields_out() -> None:
    layout = ParallelLayout(tp=2)
    assert layout.to_manifest() == {"tp": 2, "pp": 1, "dp": 1}


def _minimal_job(**status: object) -> dict:
    return {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "j", "uid": "1234", "resourceVersion": "7"},
        "spec": {
            "model": {"path": "/m"},
            "data": {"train": {"path": "/d.jsonl"}},
            "algorithm": {"name": "grpo"},
            "rollout": {"samplesPerPrompt": 2},
            "reward": {"rules": [{"name": "math_answer"}]},
            "roles": {"actor": {}},
            "trainer": {"totalSteps": 1, "promptsPerStep": 1},
        },
        "status": status,
    }


def test_status_round_trips_through_json() -> None:
    status = RLJobStatus.model_validate(
        {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AllRanksUp", "message": "4/4", "lastTransitionTime": "2026-11-29T12:00:00Z"}
            ],
            "roles": {"actor": {"active": 2, "ready": 2}},
            "step": 12,
            "restarts": 1,
            "lastCheckpoint": {"step": 10, "path": "/ckpt/step-10"},
            "metrics": {"rewardMean": 0.42, "kl": 0.01, "tokensPerSecond": 230.5},
            "startTime": "2026-11-29T11:00:00Z",
        }
    )
    assert status.conditions[0].last_transition_time == datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
    job = parse_rljob(json.loads(json.dumps(_minimal_job(**status.to_manifest()))), "x")
    assert job.status == status


def test_status_rejects_an_unknown_phase() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_rljob(_minimal_job(phase="Exploded"), "x")
    assert caught.value.problems[0].path == "status.phase"


def test_server_set_metadata_is_read() -> None:
    job = parse_rljob(_minimal_job(), "x")
    assert (job.metadata.uid, job.metadata.resource_version) == ("1234", "7")


def test_unknown_metadata_field_is_refused() -> None:
    doc = _minimal_job()
    doc["metadata"]["lables"] = {"a": "b"}
    with pytest.raises(ManifestError) as caught:
        parse_rljob(doc, "x")
    assert [(p.path, p.message) for p in caught.value.problems] == [("metadata.lables", "unknown field; did you mean labels?")]

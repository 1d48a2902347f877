"""What trainer pods are told for the input defences. The hub endpoint of a job's initializer reaches
them too: the cache keeps each endpoint's files apart (engine/hub/cache.py), and an offline trainer
finds its snapshot by the endpoint it came from. And the node's address, which HTTP tools refuse."""

from __future__ import annotations

from pathlib import Path

from kuberl.operator.api.initializer import InitializerSpec
from kuberl.operator.control.children import OperatorSettings
from kuberl.operator.validation.manifest import load_rljobs
from kuberl.operator.control.planner import plan

EXAMPLE = Path(__file__).parent.parent / "examples" / "ppo-cluster" / "rljob.yaml"


def _endpoints(desired) -> tuple[list[dict], dict[str, list[dict]]]:
    def of(container: dict) -> list[dict]:
        return [e for e in container["env"] if e["name"] == "HF_ENDPOINT"]

    initializer = of(desired.initializer["spec"]["template"]["spec"]["containers"][0])
    trainers = {r["name"]: of(r["template"]["spec"]["template"]["spec"]["containers"][0]) for r in desired.jobset["spec"]["replicatedJobs"]}
    return initializer, trainers


def test_the_charts_hub_endpoint_reaches_the_initializer_and_every_trainer_pod() -> None:
    job = load_rljobs(EXAMPLE)[0]
    job.metadata.namespace = "ns"
    settings = OperatorSettings(default_image="trainer:1", hub_endpoint="http://hub-mirror.infra.svc:8080")
    initializer, trainers = _endpoints(plan(job, uid="u", settings=settings))
    assert initializer == [{"name": "HF_ENDPOINT", "value": "http://hub-mirror.infra.svc:8080"}]
    assert trainers and all(env == initializer for env in trainers.values()), trainers


def test_a_jobs_own_endpoint_reaches_its_trainer_pods_as_the_initializer_has_it() -> None:
    job = load_rljobs(EXAMPLE)[0]
    job.metadata.namespace = "ns"
    job.spec.initializer = InitializerSpec.model_validate(
        {"env": [{"name": "HF_ENDPOINT", "valueFrom": {"configMapKeyRef": {"name": "hub", "key": "url"}}}]}
    )
    settings = OperatorSettings(default_image="trainer:1", hub_endpoint="http://hub-mirror.infra.svc:8080")
    initializer, trainers = _endpoints(plan(job, uid="u", settings=settings))
    own = [{"name": "HF_ENDPOINT", "valueFrom": {"configMapKeyRef": {"name": "hub", "key": "url"}}}]
    assert initializer == own
    assert all(env == own for env in trainers.values()), trainers


def test_no_endpoint_anywhere_means_the_public_hub_everywhere() -> None:
    job = load_rljobs(EXAMPLE)[0]
    job.metadata.namespace = "ns"
    initializer, trainers = _endpoints(plan(job, uid="u", settings=OperatorSettings(default_image="trainer:1")))
    assert initializer == [] and all(env == [] for env in trainers.values())


def test_trainer_pods_know_their_nodes_address_for_the_http_tools_to_refuse() -> None:
    job = load_rljobs(EXAMPLE)[0]
    job.metadata.namespace = "ns"
    desired = plan(job, uid="u", settings=OperatorSettings(default_image="trainer:1"))
    for replicated in desired.jobset["spec"]["replicatedJobs"]:
        env = {e["name"]: e for e in replicated["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["KUBERL_NODE_IP"] == {"name": "KUBERL_NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}

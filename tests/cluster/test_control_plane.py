"""Tests that can only pass against a real Kubernetes control plane (see the control_plane fixture)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kuberl.operator.api import GROUP, PLURAL, VERSION
from kuberl.operator.validation.manifest import ManifestError, read_documents, load_rljobs
from kuberl.operator.testing.control_plane import EXIT_ANNOTATION
from kuberl.operator.testing.waiting import eventually
from kuberl.operator.testing.corpus import rljob_files

MANIFESTS = Path(__file__).parent.parent / "manifests"
EXAMPLES = rljob_files(Path(__file__).parent.parent.parent / "examples")


def fresh_namespace(plane, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(plane.api_client()).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def test_warm_start_is_under_30_seconds(control_plane) -> None:
    # The binaries are cached before the tests run (make test builds them), so this is a warm start.
    assert control_plane.start_seconds < 30, f"start took {control_plane.start_seconds:.1f} s"


# --- the RLJob CRD on a real API server ---------------------------------------------------------


def _create(plane, doc: dict, dry_run: bool = True) -> dict:
    api = client.CustomObjectsApi(plane.api_client())
    return api.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, doc, dry_run="All" if dry_run else None, field_validation="Strict"
    )


def _our_problems(path: Path) -> list:
    with pytest.raises(ManifestError) as caught:
        load_rljobs(path)
    return caught.value.problems


def _api_server_cases() -> list[Path]:
    return [p for p in sorted((MANIFESTS / "bad").glob("*.yaml")) if not re.search(r"^# api-server: ", p.read_text(), re.M)]


# What the server sets and refuses to be sent on create; `kubectl get -o yaml` output carries them.
_SERVER_SET = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "namespace")


@pytest.mark.parametrize("path", EXAMPLES + sorted((MANIFESTS / "good").glob("*.yaml")), ids=lambda p: p.name)
def test_api_server_accepts_good_rljobs(control_plane, rljob_crd, path: Path) -> None:
    jobs = [d.content for d in read_documents(path.read_text(), str(path)) if d.content.get("kind") == "RLJob"]
    assert jobs
    for doc in jobs:
        for key in _SERVER_SET:
            doc["metadata"].pop(key, None)
        doc.pop("status", None)
        created = _create(control_plane, doc)
        assert created["spec"]["trainer"]  # defaults applied by the server, e.g. the checkpoint block
        assert created["spec"]["trainer"]["checkpoint"]["keep"] >= 1


@pytest.mark.parametrize("path", _api_server_cases(), ids=lambda p: p.stem)
def test_api_server_refuses_bad_rljobs_naming_the_field(control_plane, rljob_crd, path: Path) -> None:
    text = path.read_text()
    expected_path = re.search(r"^# expect-path: (.*)$", text, re.M).group(1)
    doc = read_documents(text, str(path))[-1].content
    with pytest.raises(ApiException) as caught:
        _create(control_plane, doc)
    body = json.loads(caught.value.body)
    ours = _our_problems(path)
    if caught.value.status == 400 and "cannot unmarshal" in body["message"]:
        # A wrong type in a field the server decodes itself (metadata): refused while decoding,
        # naming the Go field.
        assert expected_path.split(".")[1].split("[")[0] in body["message"], body["message"]
        return
    if all(problem.message.startswith("unknown field") for problem in ours):
        # Strict field validation refuses unknown fields while decoding: 400, the path in the message.
        assert caught.value.status == 400, body
        assert f'unknown field "{expected_path}"' in body["message"]
        return
    assert caught.value.status == 422, body
    fields = [cause.get("field", "") for cause in body.get("details", {}).get("causes", [])]
    # The server names the field itself, or for a missing one its parent, or for a duplicate in a list the item.
    assert any(
        expected_path == f or expected_path.startswith((f + ".", f + "[")) or f.startswith(expected_path + "[") for f in fields if f
    ), (fields, body["message"])


def test_cel_rule_message_reaches_the_client(control_plane, rljob_crd) -> None:
    path = MANIFESTS / "bad" / "ppo-without-critic.yaml"
    doc = read_documents(path.read_text(), str(path))[0].content
    with pytest.raises(ApiException) as caught:
        _create(control_plane, doc)
    assert caught.value.status == 422
    assert "ppo needs roles.critic (an estimator that learns a value function: gae)" in json.loads(caught.value.body)["message"]


def test_status_subresource_and_printer_columns(control_plane, rljob_crd) -> None:
    doc = read_documents((MANIFESTS / "good" / "grpo-base.yaml").read_text(), "grpo-base")[0].content
    doc["metadata"]["name"] = f"status-{uuid.uuid4().hex[:6]}"
    _create(control_plane, doc, dry_run=False)
    api = client.CustomObjectsApi(control_plane.api_client())
    name = doc["metadata"]["name"]
    # A status written through the main resource is ignored; the status subresource takes it.
    api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name, {"status": {"phase": "Running"}})
    assert not api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name).get("status")
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, name, {"status": {"phase": "Running", "step": 3, "metrics": {"rewardMean": 0.5}}}
    )
    table = control_plane.kubectl("get", "rlj", name, "--no-headers").stdout.split()
    assert table[:4] == [name, "Running", "3", "0.5"], table
    api.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)


# --- authentication and authorisation ---------------------------------------------------------------


def test_service_account_needs_a_role_to_list_pods(control_plane) -> None:
    admin = control_plane.api_client()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    ns = fresh_namespace(control_plane, "rbac")
    core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
    token = core.create_namespaced_service_account_token(
        "reader", ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token
    as_reader = client.CoreV1Api(control_plane.api_client(token=token))

    with pytest.raises(ApiException) as caught:
        as_reader.list_namespaced_pod(ns)
    assert caught.value.status == 403

    rbac.create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="reader-reads-pods"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=ns)],
        ),
    )

    def allowed() -> bool:
        try:
            as_reader.list_namespaced_pod(ns)
            return True
        except ApiException as exc:
            assert exc.status == 403
            return False

    eventually(allowed, 20, "the RoleBinding to take effect")
    # Still nothing beyond the Role: secrets stay forbidden.
    with pytest.raises(ApiException) as caught:
        as_reader.list_namespaced_secret(ns)
    assert caught.value.status == 403


# --- scheduling onto kwok GPU node pools --------------------------------------------------------


def _gpu_job(name: str, tolerate: bool) -> dict:
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"kuberl.dev/pool": "gpu-a100"},
        "containers": [{"name": "worker", "image": "kuberl/trainer:test", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
    }
    if tolerate:
        pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 3,
            "parallelism": 3,
            "backoffLimit": 0,
            "template": {"metadata": {"annotations": {EXIT_ANNOTATION: "succeed"}}, "spec": pod_spec},
        },
    }


def test_indexed_gpu_job_lands_on_the_gpu_pool_and_succeeds(control_plane) -> None:
    ns = fresh_namespace(control_plane, "gpu")
    batch, core = client.BatchV1Api(control_plane.api_client()), client.CoreV1Api(control_plane.api_client())
    batch.create_namespaced_job(ns, _gpu_job("train", tolerate=True))

    def complete():
        # Since Kubernetes 1.31 `succeeded` reaches 3 with SuccessCriteriaMet first; Complete follows
        # once every pod is terminal, a window this test could read the Job in: wait for Complete itself.
        job = batch.read_namespaced_job("train", ns)
        done = any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])
        return job if done else None

    job = eventually(complete, 90, "the indexed Job to be Complete")
    assert job.status.succeeded == 3
    pods = core.list_namespaced_pod(ns, label_selector="job-name=train").items
    assert sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1", "2"]
    nodes = {p.spec.node_name for p in pods}
    assert nodes and all(n.startswith("gpu-a100-") for n in nodes), nodes
    # 3 pods x 4 GPUs cannot fit on one 8-GPU node: the scheduler counted the extended resource.
    assert len(nodes) == 2


def test_gpu_pod_without_toleration_stays_pending(control_plane) -> None:
    ns = fresh_namespace(control_plane, "taint")
    client.BatchV1Api(control_plane.api_client()).create_namespaced_job(ns, _gpu_job("untolerated", tolerate=False))
    core = client.CoreV1Api(control_plane.api_client())

    def unschedulable():
        pods = core.list_namespaced_pod(ns).items
        return pods and all(
            any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in (p.status.conditions or []))
            for p in pods
        )

    eventually(unschedulable, 60, "the scheduler to refuse the untolerated GPU pods")
    assert all(p.spec.node_name is None for p in core.list_namespaced_pod(ns).items)


def test_failed_annotation_makes_a_pod_fail(control_plane) -> None:
    ns = fresh_namespace(control_plane, "fail")
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_pod(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"nodeSelector": {"kuberl.dev/pool": "cpu"}, "containers": [{"name": "c", "image": "x"}]},
        },
    )
    eventually(lambda: core.read_namespaced_pod("p", ns).status.phase == "Running", 60, "the pod to run")
    core.patch_namespaced_pod("p", ns, {"metadata": {"annotations": {EXIT_ANNOTATION: "fail"}}})
    pod = eventually(lambda: (p := core.read_namespaced_pod("p", ns)).status.phase == "Failed" and p, 60, "the pod to fail")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 1


# --- garbage collection and Helm ------------------------------------------------------------------


def test_deleting_an_owner_collects_its_children(control_plane) -> None:
    ns = fresh_namespace(control_plane, "gc")
    core = client.CoreV1Api(control_plane.api_client())
    owner = core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    core.create_namespaced_config_map(
        ns,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name="child",
                owner_references=[client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)],
            )
        ),
    )
    core.delete_namespaced_config_map("owner", ns, propagation_policy="Background")

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", ns)
            return False
        except ApiException as exc:
            return exc.status == 404

    eventually(child_gone, 60, "the garbage collector to delete the child")


def test_helm_installs_and_uninstalls_a_chart(control_plane, tmp_path: Path) -> None:
    chart = tmp_path / "greeting"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: greeting\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\ndata:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    control_plane.helm("install", "demo", str(chart), "-n", "helm-test", "--create-namespace", "--set", "greeting=hi", "--wait")
    data = json.loads(control_plane.kubectl("get", "configmap", "demo-greeting", "-n", "helm-test", "-o", "json").stdout)["data"]
    assert data == {"greeting": "hi"}
    assert "demo" in control_plane.helm("list", "-n", "helm-test", "-q").stdout.split()
    control_plane.helm("uninstall", "demo", "-n", "helm-test", "--wait")
    gone = control_plane.kubectl("get", "configmap", "demo-greeting", "-n", "helm-test", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


# --- the launcher itself ---------------------------------------------------------------------------


def test_missing_binaries_are_named(tmp_path: Path) -> None:
    from kuberl.operator.testing.control_plane import ControlPlaneError, start_control_plane

    with pytest.raises(ControlPlaneError, match="missing binaries in .*: etcd, kube-apiserver"):
        start_control_plane(tmp_path, tmp_path / "work")


def test_a_second_plane_starts_and_stops_leaving_no_process(control_plane, tmp_path: Path) -> None:
    from kuberl.operator.testing.control_plane import NodePool, start_control_plane

    plane = start_control_plane(control_plane.bin_dir, tmp_path / "second", pools=(NodePool("tiny", 1),))
    processes = list(plane.processes.values())
    nodes = json.loads(plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes] == ["tiny-0"]
    plane.stop()
    assert all(p.poll() is not None for p in processes)
    assert not plane.processes

"""A namespaced install on a real control plane: the chart's RBAC with watchNamespaces, and the operator
running with exactly those rights. A job in a watched namespace runs; one elsewhere gets nothing; the
operator's identity can write nowhere but in the watched namespace."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml
from kubernetes import client

from kuberl.operator.testing.operator_process import OperatorProcess
from kuberl.operator.testing.rljobs import create, get, new_namespace, small_job, wait_phase

REPO = Path(__file__).resolve().parent.parent.parent
CHART = REPO / "helm" / "kuberl"
RELEASE, RELEASE_NS = "kuberl-confined", "kuberl-confined"
IMAGES = [
    "--set",
    "image.repository=registry.example.com/team/kuberl-operator,trainerImage=registry.example.com/team/kuberl-trainer:0.1.0-cpu",
]
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _may(plane, verb: str, resource: str, namespace: str | None, group: str = "") -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{RELEASE_NS}:{RELEASE}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{RELEASE_NS}", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "resource": resource, "group": group, **({"namespace": namespace} if namespace else {})},
        },
    }
    return client.AuthorizationV1Api(plane.api_client()).create_subject_access_review(review).status.allowed


def test_a_namespaced_install_reconciles_only_its_namespaces_with_only_namespaced_writes(
    control_plane, rljob_crd, kube_binaries_dir: Path, tmp_path: Path
) -> None:
    plane = control_plane
    watched, unwatched = new_namespace(plane, "watched"), new_namespace(plane, "unwatched")
    plane.kubectl("create", "namespace", RELEASE_NS, check=False)
    rendered = subprocess.run(
        [
            str(kube_binaries_dir / "helm"),
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            RELEASE_NS,
            "--kube-version",
            "1.37.2",
            *IMAGES,
            "--set",
            f"watchNamespaces[0]={watched}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr
    rbac = [d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] in RBAC_KINDS]
    assert {d["kind"] for d in rbac} == set(RBAC_KINDS)
    plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in rbac))

    # What the identity may do: write in the watched namespace only; cluster-wide, read CRDs.
    assert _may(plane, "create", "configmaps", watched) and _may(plane, "create", "jobsets", watched, "jobset.x-k8s.io")
    assert _may(plane, "create", "networkpolicies", watched, "networking.k8s.io")
    for ns in (unwatched, "kube-system", None):
        assert not _may(plane, "create", "configmaps", ns), ns
        assert not _may(plane, "create", "roles", ns, "rbac.authorization.k8s.io"), ns
        assert not _may(plane, "create", "serviceaccounts", ns), ns
        assert not _may(plane, "create", "jobs", ns, "batch"), ns
        assert not _may(plane, "list", "pods", ns), ns
    assert _may(plane, "list", "customresourcedefinitions", None, "apiextensions.k8s.io")

    token = (
        client.CoreV1Api(plane.api_client())
        .create_namespaced_service_account_token(
            RELEASE,
            RELEASE_NS,
            client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
        )
        .status.token
    )
    operator = OperatorProcess(
        plane.kubeconfig_for_token(token, tmp_path / "confined.kubeconfig"), tmp_path / "operator.log", args=("--namespace", watched)
    )
    operator.start()
    try:
        create(plane, unwatched, small_job("ignored"))
        create(plane, watched, small_job("served"))
        wait_phase(plane, watched, "served", "Running", timeout=90)
        for kind in ("ConfigMap", "NetworkPolicy", "Role", "RoleBinding", "ServiceAccount", "Service"):
            assert plane.kubectl("get", kind, "-n", watched, "-l", "kuberl.dev/job=served", "-o", "name").stdout.strip(), kind
        time.sleep(5)  # the unwatched job was created first: had the operator seen it, it would have acted by now
        assert "status" not in get(plane, unwatched, "ignored")
        left = plane.kubectl(
            "get",
            "all,configmaps,roles,rolebindings,serviceaccounts,networkpolicies",
            "-n",
            unwatched,
            "-l",
            "kuberl.dev/job",
            "-o",
            "name",
        ).stdout.strip()
        assert left == "", left
    finally:
        operator.stop()
        plane.kubectl("delete", "-f", "-", "--ignore-not-found", input="\n---\n".join(json.dumps(d) for d in rbac), check=False)
    log = operator.log.read_text()
    assert "forbidden" not in log.lower() and "Traceback" not in log, log[-4000:]

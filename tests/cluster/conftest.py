"""The cluster tier's operator: `kuberl operator` as a process with exactly the rights the chart grants."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kuberl.operator.testing.operator_process import OperatorProcess

REPO = Path(__file__).resolve().parent.parent.parent
RULES = REPO / "helm" / "kuberl" / "files" / "operator-rules.yaml"
CLUSTER_RULES = REPO / "helm" / "kuberl" / "files" / "operator-cluster-rules.yaml"


def cluster_wide_rules() -> list[dict]:
    """The chart's ClusterRole without watchNamespaces: the namespaced rules and the cluster-wide ones."""
    return yaml.safe_load(RULES.read_text()) + yaml.safe_load(CLUSTER_RULES.read_text())


def _ensure(create) -> None:
    """Create, unless it exists (each module that runs an operator makes the same identity)."""
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture(scope="module")
def operator_args() -> tuple[str, ...]:
    """More `kuberl operator` flags for a module's operator (a module overrides this fixture): none by default,
    as the chart's default values give none."""
    return ()


@pytest.fixture(scope="module")
def operator(control_plane, rljob_crd, tmp_path_factory, operator_args):
    """One operator per module: two at once would reconcile the same jobs."""
    admin = control_plane.api_client()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    _ensure(lambda: core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="kuberl-system"))))
    _ensure(
        lambda: core.create_namespaced_service_account(
            "kuberl-system", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="kuberl-operator"))
        )
    )
    _ensure(
        lambda: rbac.create_cluster_role(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "kuberl-operator"},
                "rules": cluster_wide_rules(),
            }
        )
    )
    _ensure(
        lambda: rbac.create_cluster_role_binding(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "kuberl-operator"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kuberl-operator"},
                "subjects": [{"kind": "ServiceAccount", "name": "kuberl-operator", "namespace": "kuberl-system"}],
            }
        )
    )
    token = core.create_namespaced_service_account_token(
        "kuberl-operator",
        "kuberl-system",
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)),
    ).status.token
    workdir = tmp_path_factory.mktemp("operator")
    process = OperatorProcess(
        control_plane.kubeconfig_for_token(token, workdir / "operator.kubeconfig"), workdir / "operator.log", args=operator_args
    )
    process.start()
    yield process
    process.stop()
    log = process.log.read_text()
    # The shipped rules suffice: nothing the operator asked for was forbidden, nothing crashed.
    assert "forbidden" not in log.lower() and "Traceback" not in log, log[-5000:]

"""The Helm chart: lint, render, server-side dry run and install on the real control plane, and the
operator running with the chart's own ServiceAccount and RBAC until an RLJob is Running."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kuberl.operator.api import GROUP, PLURAL, VERSION
from kuberl.operator.testing.operator_process import OperatorProcess
from kuberl.operator.testing.waiting import eventually

REPO = Path(__file__).resolve().parent.parent.parent
CHART = REPO / "helm" / "kuberl"
KUBE_VERSION = "1.37.2"
EVERY_OPTION = ["--set", "serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true,"
                "grafanaDashboard.enabled=true,watchNamespaces[0]=team-a,watchNamespaces[1]=team-b,"
                "imagePullSecrets[0].name=regcred,nodeSelector.pool=system,priorityClassName=system-cluster-critical"]


@pytest.fixture(scope="module")
def helm(kube_binaries_dir: Path):
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(kube_binaries_dir / "helm"), *args], capture_output=True, text=True, timeout=120)
        if check:
            assert result.returncode == 0, result.stderr
        return result
    return run


def render(helm, *args: str) -> list[dict]:
    out = helm("template", "kuberl", str(CHART), "--namespace", "kuberl-chart", "--kube-version", KUBE_VERSION, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("options", [[], EVERY_OPTION], ids=["defaults", "every-option"])
def test_helm_lint_is_clean(helm, options: list[str]) -> None:
    result = helm("lint", str(CHART), "--kube-version", KUBE_VERSION, *options)
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_chart_ships_the_generated_crd() -> None:
    assert (CHART / "crds" / "kuberl.dev_rljobs.yaml").read_text() == (REPO / "crds" / "kuberl.dev_rljobs.yaml").read_text()


def test_chart_rbac_is_the_tested_rules_file(helm) -> None:
    [role] = [d for d in render(helm) if d["kind"] == "ClusterRole"]
    assert role["rules"] == yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())


def test_values_schema_refuses_a_second_replica(helm) -> None:
    result = helm("template", "kuberl", str(CHART), "--kube-version", KUBE_VERSION, "--set", "replicaCount=2", check=False)
    assert result.returncode != 0 and "replicaCount" in result.stderr


def test_operator_pod_is_locked_down(helm) -> None:
    [deployment] = [d for d in render(helm) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    [container] = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" and container["resources"]["limits"]
    assert container["args"][0] == "operator"


# Stand-ins for prometheus-operator's CRDs (its CRD files cannot be fetched here): they accept any
# spec, so the dry run checks those three objects' metadata only; every other object is checked in full.
MONITORING_STAND_INS = [
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": f"{plural}.monitoring.coreos.com"},
     "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
              "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
              "versions": [{"name": "v1", "served": True, "storage": True,
                            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    for plural, kind in (("servicemonitors", "ServiceMonitor"), ("podmonitors", "PodMonitor"), ("prometheusrules", "PrometheusRule"))
]


def test_every_rendered_object_passes_a_server_side_dry_run_with_stand_in_monitoring_crds(control_plane, rljob_crd, helm) -> None:
    control_plane.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(c) for c in MONITORING_STAND_INS))
    for crd in MONITORING_STAND_INS:
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
    control_plane.kubectl("create", "namespace", "kuberl-chart", check=False)
    for options in ([], EVERY_OPTION):
        docs = render(helm, *options)
        kinds = {d["kind"] for d in docs}
        assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} <= kinds
        if options:
            assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds
        for doc in docs:
            result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
            assert result.returncode == 0, f"{doc['kind']}/{doc['metadata']['name']}: {result.stderr}"


def test_helm_install_runs_the_operator_with_the_charts_rbac(control_plane, rljob_crd, tmp_path: Path) -> None:
    plane = control_plane
    plane.helm("install", "kuberl", str(CHART), "--namespace", "kuberl-chart", "--create-namespace",
               "--set", "nodeSelector.kuberl\\.dev/pool=cpu", "--wait", "--timeout", "120s")
    apps, core = client.AppsV1Api(plane.api_client()), client.CoreV1Api(plane.api_client())
    deployment = apps.read_namespaced_deployment("kuberl", "kuberl-chart")
    assert deployment.status.ready_replicas == 1  # kwok ran the operator's pod
    # The same operator, as a process here, with the token of the chart's ServiceAccount: exactly
    # the rights the chart grants.
    token = core.create_namespaced_service_account_token(
        "kuberl", "kuberl-chart",
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
    ).status.token
    operator = OperatorProcess(plane.kubeconfig_for_token(token, tmp_path / "chart.kubeconfig"), tmp_path / "operator.log")
    operator.start()
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="chart-jobs")))
        job = {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "after-install"},
               "spec": {"model": {"path": "/models/m"}, "data": {"train": {"path": "/data/train.jsonl"}},
                        "algorithm": {"name": "grpo"}, "rollout": {"samplesPerPrompt": 4},
                        "reward": {"rules": [{"name": "math_answer"}]},
                        "roles": {"actor": {"replicas": 1, "nodeSelector": {"kuberl.dev/pool": "cpu"}}},
                        "trainer": {"totalSteps": 10, "promptsPerStep": 4}}}
        custom = client.CustomObjectsApi(plane.api_client())
        custom.create_namespaced_custom_object(GROUP, VERSION, "chart-jobs", PLURAL, job)

        def running():
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, "chart-jobs", PLURAL, "after-install")
            return (obj.get("status") or {}).get("phase") == "Running"

        eventually(running, 90, "the RLJob to be Running")
    finally:
        operator.stop()
        plane.helm("uninstall", "kuberl", "--namespace", "kuberl-chart", check=False)
    log = operator.log.read_text()
    assert "forbidden" not in log.lower() and "Traceback" not in log, log[-4000:]

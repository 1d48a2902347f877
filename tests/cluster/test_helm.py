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
# The two values without a default: where the user pushed the images (no public registry hosts them).
IMAGES = [
    "--set",
    "image.repository=registry.example.com/team/kuberl-operator,trainerImage=registry.example.com/team/kuberl-trainer:0.1.0-cpu",
]
EVERY_OPTION = [
    "--set",
    "hubEndpoint=http://hub-mirror.infra.svc:8080,"
    "serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true,"
    "grafanaDashboard.enabled=true,watchNamespaces[0]=team-a,watchNamespaces[1]=team-b,"
    "imagePullSecrets[0].name=regcred,nodeSelector.pool=system,priorityClassName=system-cluster-critical",
]


@pytest.fixture(scope="module")
def helm(kube_binaries_dir: Path):
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(kube_binaries_dir / "helm"), *args], capture_output=True, text=True, timeout=120)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run


def render(helm, *args: str) -> list[dict]:
    out = helm("template", "kuberl", str(CHART), "--namespace", "kuberl-chart", "--kube-version", KUBE_VERSION, *IMAGES, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize(
    "options", [[], EVERY_OPTION, ["--set", "jobset.install=true"]], ids=["defaults", "every-option", "jobset-install"]
)
def test_helm_lint_is_clean(helm, options: list[str]) -> None:
    result = helm("lint", str(CHART), "--kube-version", KUBE_VERSION, *IMAGES, *options)
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_the_chart_asks_for_the_images_the_user_pushed(helm) -> None:
    result = helm("template", "kuberl", str(CHART), "--kube-version", KUBE_VERSION, check=False)
    assert result.returncode != 0
    assert "image.repository: where you pushed the operator image (make images, then make push REGISTRY=...)" in result.stderr
    [deployment] = [d for d in render(helm, *EVERY_OPTION) if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--default-image=registry.example.com/team/kuberl-trainer:0.1.0-cpu" in args
    assert "--hub-endpoint=http://hub-mirror.infra.svc:8080" in args


JOBSET_CRD = "jobsets.jobset.x-k8s.io"


def test_jobset_install_renders_jobsets_own_chart(helm) -> None:
    """jobset.install=true: the vendored JobSet chart (charts/jobset) with the release, its CRD, controller and webhooks;
    without it, nothing of JobSet."""

    def jobset_parts(*options: str) -> dict[tuple[str, str], dict]:
        docs = render(helm, "--include-crds", *options)
        return {
            (d["kind"], d["metadata"]["name"]): d
            for d in docs
            if d["metadata"]["name"] == JOBSET_CRD or d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "jobset"
        }

    assert jobset_parts() == {}
    assert jobset_parts("--set", "jobset.install=false") == {}
    parts = jobset_parts("--set", "jobset.install=true")
    crd = parts[("CustomResourceDefinition", JOBSET_CRD)]
    assert crd["spec"]["group"] == "jobset.x-k8s.io"
    [(name, deployment)] = [(n, d) for (kind, n), d in parts.items() if kind == "Deployment"]
    assert name == "kuberl-jobset-controller" and deployment["metadata"]["namespace"] == "kuberl-chart"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.k8s.io/jobset/jobset:v0.12.0"
    assert {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Service", "ClusterRole"} <= {k for k, _ in parts}
    # The image is a value (no registry needs to be reachable from the chart's side: a mirror's will do).
    [mirrored] = [
        d
        for (kind, _), d in jobset_parts(
            "--set", "jobset.install=true,jobset.image.repository=mirror.example/jobset,jobset.image.tag=v0.12.0-mirror"
        ).items()
        if kind == "Deployment"
    ]
    assert mirrored["spec"]["template"]["spec"]["containers"][0]["image"] == "mirror.example/jobset:v0.12.0-mirror"
    # kuberl's own objects are the same either way.
    assert [d for d in render(helm) if d["kind"] == "Deployment"] == [
        d for d in render(helm, "--set", "jobset.install=true") if d["kind"] == "Deployment" and d["metadata"]["name"] == "kuberl"
    ]


def test_chart_ships_the_generated_crd() -> None:
    assert (CHART / "crds" / "kuberl.dev_rljobs.yaml").read_text() == (REPO / "crds" / "kuberl.dev_rljobs.yaml").read_text()


RULES = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
CLUSTER_RULES = yaml.safe_load((CHART / "files" / "operator-cluster-rules.yaml").read_text())
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "bind", "escalate", "impersonate", "*"}


def test_chart_rbac_is_the_tested_rules_file(helm) -> None:
    [role] = [d for d in render(helm) if d["kind"] == "ClusterRole"]
    assert role["rules"] == RULES + CLUSTER_RULES


def test_a_namespaced_install_binds_no_cluster_role_that_can_write(helm) -> None:
    docs = render(helm, "--set", "watchNamespaces[0]=team-a,watchNamespaces[1]=team-b")
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert bindings, "kopf still needs its cluster-wide reads"
    for binding in bindings:
        rules = roles[binding["roleRef"]["name"]]["rules"]
        writes = {(tuple(r["resources"]), v) for r in rules for v in r["verbs"] if v in WRITE_VERBS}
        assert not writes, f"ClusterRoleBinding {binding['metadata']['name']} grants {writes} cluster-wide"
    # Every write right is a Role in a watched namespace, bound there, and nowhere else.
    namespaced = {(d["kind"], d["metadata"]["namespace"]): d for d in docs if d["kind"] in ("Role", "RoleBinding")}
    assert set(namespaced) == {(k, ns) for k in ("Role", "RoleBinding") for ns in ("team-a", "team-b")}
    for ns in ("team-a", "team-b"):
        assert namespaced[("Role", ns)]["rules"] == RULES
        binding = namespaced[("RoleBinding", ns)]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": namespaced[("Role", ns)]["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl", "namespace": "kuberl-chart"}]
    # Without watchNamespaces, today's single ClusterRole: the operator must reach every namespace.
    assert not [d for d in render(helm) if d["kind"] in ("Role", "RoleBinding")]


def test_the_network_policy_value_reaches_the_operator(helm) -> None:
    def args(*options: str) -> list[str]:
        [deployment] = [d for d in render(helm, *options) if d["kind"] == "Deployment"]
        return deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    default = args()
    assert "--no-network-policy" not in default
    [peer] = [a for a in default if a.startswith("--metrics-peer=")]
    assert json.loads(peer.split("=", 1)[1]) == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    assert "--no-network-policy" in args("--set", "networkPolicy.enabled=false")
    assert not [a for a in args("--set", "networkPolicy.metricsFrom=null") if a.startswith("--metrics-peer")]


def test_the_tool_networks_and_admission_values_reach_the_operators_settings(helm, monkeypatch) -> None:
    """The chart's values become the operator's flags, and those flags its settings (what the planner reads)."""
    import kuberl.operator.control.manager
    from kuberl.operator.validation.admission import AdmissionPolicy
    from kuberl.operator.cli.commands import build_parser

    def settings(*options: str):
        [deployment] = [d for d in render(helm, *options) if d["kind"] == "Deployment"]
        args = build_parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
        started = []  # the options `kuberl operator` would run the operator with, instead of running it
        monkeypatch.setattr(kuberl.operator.control.manager, "run", started.append)
        assert args.func(args) == 0
        return started[0].settings

    default = settings()
    assert default.tool_networks == () and default.admission == AdmissionPolicy()
    chosen = settings("--set", "tools.allowedNetworks={10.0.0.0/8,fd00::/8}", "--set", "admission.allowedVolumeSources={hostPath}")
    assert chosen.tool_networks == ("10.0.0.0/8", "fd00::/8")
    assert "hostPath" in chosen.admission.volume_sources
    refused = helm("template", "kuberl", str(CHART), "--kube-version", "1.31.0", "--set", "tools.allowedNetworks={not-a-cidr}", check=False)
    assert refused.returncode != 0 and "allowedNetworks" in refused.stderr


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
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    for plural, kind in (("servicemonitors", "ServiceMonitor"), ("podmonitors", "PodMonitor"), ("prometheusrules", "PrometheusRule"))
]


def test_every_rendered_object_passes_a_server_side_dry_run_with_stand_in_monitoring_crds(control_plane, rljob_crd, helm) -> None:
    control_plane.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(c) for c in MONITORING_STAND_INS))
    for crd in MONITORING_STAND_INS:
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
    for namespace in ("kuberl-chart", "team-a", "team-b"):  # the release's, and the watched ones (their Roles)
        control_plane.kubectl("create", "namespace", namespace, check=False)
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
    plane.helm(
        "install",
        "kuberl",
        str(CHART),
        "--namespace",
        "kuberl-chart",
        "--create-namespace",
        *IMAGES,
        "--set",
        "nodeSelector.kuberl\\.dev/pool=cpu",
        "--wait",
        "--timeout",
        "120s",
    )
    apps, core = client.AppsV1Api(plane.api_client()), client.CoreV1Api(plane.api_client())
    deployment = apps.read_namespaced_deployment("kuberl", "kuberl-chart")
    assert deployment.status.ready_replicas == 1  # kwok ran the operator's pod
    # The same operator, as a process here, with the token of the chart's ServiceAccount: exactly
    # the rights the chart grants.
    token = core.create_namespaced_service_account_token(
        "kuberl",
        "kuberl-chart",
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
    ).status.token
    operator = OperatorProcess(plane.kubeconfig_for_token(token, tmp_path / "chart.kubeconfig"), tmp_path / "operator.log")
    operator.start()
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="chart-jobs")))
        job = {
            "apiVersion": "kuberl.dev/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "after-install"},
            "spec": {
                "model": {"path": "/data/models/m"},
                "data": {"train": {"path": "/data/train.jsonl"}},
                "volumes": [{"name": "data", "emptyDir": {}}],
                "algorithm": {"name": "grpo"},
                "rollout": {"samplesPerPrompt": 4},
                "reward": {"rules": [{"name": "math_answer"}]},
                "roles": {
                    "actor": {
                        "replicas": 1,
                        "nodeSelector": {"kuberl.dev/pool": "cpu"},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                },
                "trainer": {"totalSteps": 10, "promptsPerStep": 4},
            },
        }
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


def test_the_packaged_chart_of_make_dist_installs_and_uninstalls(control_plane, rljob_crd, tmp_path: Path) -> None:
    # The chart as released: the .tgz that scripts/dist.sh makes (here without the Python package and
    # the images), installed beside the test above under a release and namespace of its own.
    import os
    import tarfile

    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    made = subprocess.run(
        ["bash", str(REPO / "scripts" / "dist.sh"), str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DIST_IMAGES": "0", "DIST_PYTHON": "0"},
    )
    assert made.returncode == 0, made.stderr
    package = tmp_path / "dist" / f"kuberl-{version}.tgz"
    with tarfile.open(package) as tgz:  # the CRD it would install is the generated one
        assert (
            tgz.extractfile("kuberl/crds/kuberl.dev_rljobs.yaml").read().decode() == (REPO / "crds" / "kuberl.dev_rljobs.yaml").read_text()
        )
    plane = control_plane
    try:
        plane.helm(
            "install",
            "kuberl-dist",
            str(package),
            "--namespace",
            "kuberl-dist",
            "--create-namespace",
            *IMAGES,
            "--set",
            "nodeSelector.kuberl\\.dev/pool=cpu",
            "--wait",
            "--timeout",
            "120s",
        )
        [release] = json.loads(plane.helm("list", "--namespace", "kuberl-dist", "--output", "json").stdout)
        assert (release["name"], release["status"], release["chart"], release["app_version"]) == (
            "kuberl-dist",
            "deployed",
            f"kuberl-{version}",
            version,
        ), release
        deployment = client.AppsV1Api(plane.api_client()).read_namespaced_deployment("kuberl-dist", "kuberl-dist")
        assert deployment.status.ready_replicas == 1  # kwok ran the operator's pod
        assert deployment.spec.template.spec.containers[0].image.endswith(f":{version}")  # the tag defaults to appVersion
        crd = json.loads(plane.kubectl("get", "crd", f"{PLURAL}.{GROUP}", "--output", "json").stdout)
        assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
        assert VERSION in [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    finally:
        plane.helm("uninstall", "kuberl-dist", "--namespace", "kuberl-dist", "--wait", "--timeout", "120s", check=False)
        plane.kubectl("delete", "namespace", "kuberl-dist", "--wait=false", check=False)
    assert json.loads(plane.helm("list", "--namespace", "kuberl-dist", "--output", "json").stdout) == []
    # Helm never deletes the CRDs of a chart's crds/ folder: the users' RLJobs outlive the operator.
    assert plane.kubectl("get", "crd", f"{PLURAL}.{GROUP}", check=False).returncode == 0


def test_install_into_a_cluster_without_jobset_fails_saying_what_to_do_unless_the_chart_brings_it(
    kube_binaries_dir: Path, tmp_path: Path
) -> None:
    # A control plane of its own: the session's has JobSet (every other install here passes the check).
    from kuberl.operator.testing.control_plane import start_control_plane

    plane = start_control_plane(kube_binaries_dir, tmp_path / "plane", pools=())
    try:
        failed = plane.helm("install", "kuberl", str(CHART), "--namespace", "kuberl-nojobset", "--create-namespace", *IMAGES, check=False)
        assert failed.returncode != 0
        assert (
            "JobSet is not installed in this cluster (no CustomResourceDefinition jobsets.jobset.x-k8s.io): kuberl runs "
            "every RLJob as a JobSet. Install JobSet v0.12.0 or newer first"
        ) in failed.stderr, failed.stderr
        assert json.loads(plane.helm("list", "--all-namespaces", "--output", "json").stdout) == []  # nothing installed
        # (Helm applies the chart's crds/ before it renders the templates, so the RLJob CRD is there: harmless,
        # and the next install, JobSet in place, keeps it.)
        # Asked to skip it, the same install renders against the server (its lookups answered).
        skipped = plane.helm(
            "install",
            "kuberl",
            str(CHART),
            "--namespace",
            "kuberl-nojobset",
            "--create-namespace",
            *IMAGES,
            "--set",
            "jobset.required=false",
            "--dry-run=server",
            check=False,
        )
        assert skipped.returncode == 0, skipped.stderr
        # An install that brings JobSet itself (jobset.install) is not refused, not even as a dry run (which applies no CRD).
        bringing = plane.helm(
            "install",
            "kuberl",
            str(CHART),
            "--namespace",
            "kuberl-nojobset",
            "--create-namespace",
            *IMAGES,
            "--set",
            "jobset.install=true",
            "--dry-run=server",
            check=False,
        )
        assert bringing.returncode == 0, bringing.stderr
        assert plane.kubectl("get", "crd", JOBSET_CRD, check=False).returncode != 0
        # An upgrade applies no crds/ folder: turning jobset.install on for a release without JobSet is refused, saying so.
        plane.helm(
            "install",
            "kuberl",
            str(CHART),
            "--namespace",
            "kuberl-nojobset",
            "--create-namespace",
            *IMAGES,
            "--set",
            "jobset.required=false",
        )
        upgraded = plane.helm(
            "upgrade", "kuberl", str(CHART), "--namespace", "kuberl-nojobset", *IMAGES, "--set", "jobset.install=true", check=False
        )
        assert upgraded.returncode != 0
        assert "helm upgrade does not apply the CRDs of a chart's crds/ folder" in upgraded.stderr, upgraded.stderr
        plane.helm("uninstall", "kuberl", "--namespace", "kuberl-nojobset", "--wait", "--timeout", "60s")
        # A fresh install with jobset.install=true: Helm applies JobSet's CRD before it renders, and the check passes.
        plane.helm(
            "install", "kuberl", str(CHART), "--namespace", "kuberl-nojobset", "--create-namespace", *IMAGES, "--set", "jobset.install=true"
        )
        crd = json.loads(plane.kubectl("get", "crd", JOBSET_CRD, "--output", "json").stdout)
        assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"]), crd["status"]
        deployment = client.AppsV1Api(plane.api_client()).read_namespaced_deployment("kuberl-jobset-controller", "kuberl-nojobset")
        assert deployment.spec.template.spec.containers[0].image == "registry.k8s.io/jobset/jobset:v0.12.0"
        [release] = json.loads(plane.helm("list", "--namespace", "kuberl-nojobset", "--output", "json").stdout)
        assert release["status"] == "deployed", release
        # Later upgrades find JobSet's CRD in place.
        plane.helm("upgrade", "kuberl", str(CHART), "--namespace", "kuberl-nojobset", *IMAGES, "--set", "jobset.install=true")
    finally:
        plane.stop()

"""What an RLJob may ask of its pods: the admission defaults in `kuberl validate` and the operator, the chart's
copy of the same rules as CEL (evaluated here with cel-python against the same manifests), and what only the
cluster can check. The real API server with the chart's policy: tests/cluster/test_admission_policy.py."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes

from kuberl.operator.validation.admission import (
    DEFAULT_VOLUME_SOURCES,
    GRANTING_FIELDS,
    VOLUME_SOURCES,
    AdmissionPolicy,
    admission_problems,
    cluster_checks,
    secret_references,
)
from kuberl.operator.codegen.admission_policy import CHART_VARIABLES, policy, policy_json
from kuberl.operator.api.spec import IMMUTABLE_FIELDS
from kuberl.operator.validation.manifest import parse_rljob
from kuberl.operator.validation.yaml_reader import read_documents

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "kuberl"
BASE = REPO / "tests" / "manifests" / "good" / "cluster-base.yaml"


def base() -> dict[str, Any]:
    return copy.deepcopy(read_documents(BASE.read_text(), str(BASE))[0].content)


def problems(doc: dict[str, Any], allowed: AdmissionPolicy = AdmissionPolicy()) -> list[str]:
    return [f"{p.path}: {p.message}" for p in admission_problems(parse_rljob(doc, "job.yaml"), "job.yaml", allowed)]


# --- the attacks, refused by default and let through only by the chart's value --------------------


def with_volume(source: dict[str, Any]) -> dict[str, Any]:
    doc = base()
    doc["spec"]["volumes"].append({"name": "extra", **source})
    return doc


@pytest.mark.parametrize(
    "source",
    [
        {"hostPath": {"path": "/"}},
        {"hostPath": {"path": "/var/run/containerd/containerd.sock", "type": "Socket"}},
        {"gitRepo": {"repository": "https://example.com/x.git"}},
        {"nfs": {"server": "10.0.0.1", "path": "/"}},
        {"iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}},
    ],
    ids=lambda s: next(iter(s)),
)
def test_a_volume_that_reaches_the_node_or_a_server_is_refused_by_default_naming_the_chart_value(source: dict[str, Any]) -> None:
    kind = next(iter(source))
    [found] = problems(with_volume(source))
    assert found.startswith(f"spec.volumes[2].{kind}: volume extra: {kind} is not an allowed volume source")
    assert "admission.allowedVolumeSources" in found
    assert problems(with_volume(source), AdmissionPolicy(allowed_volume_sources=(kind,))) == []


@pytest.mark.parametrize("kind", DEFAULT_VOLUME_SOURCES)
def test_the_default_volume_sources_pass(kind: str) -> None:
    sources = {
        "persistentVolumeClaim": {"claimName": "c"},
        "configMap": {"name": "m"},
        "secret": {"secretName": "s"},
        "emptyDir": {},
        "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}},
        "projected": {"sources": []},
        "csi": {"driver": "x.example.com"},
        "image": {"reference": "r.example/x:1"},
        "downwardAPI": {"items": []},
    }
    assert problems(with_volume({kind: sources[kind]})) == []


def test_a_runtime_class_is_refused_unless_the_chart_lists_it() -> None:
    doc = base()
    doc["spec"]["roles"]["actor"]["runtimeClassName"] = "runc-privileged"
    [found] = problems(doc)
    assert found.startswith("spec.roles.actor.runtimeClassName: RuntimeClass runc-privileged is not allowed (allowed: none)")
    assert "admission.allowedRuntimeClasses" in found
    assert problems(doc, AdmissionPolicy(allowed_runtime_classes=("gvisor",))) != []
    assert problems(doc, AdmissionPolicy(allowed_runtime_classes=("gvisor", "runc-privileged"))) == []


@pytest.mark.parametrize(
    "key",
    [
        "container.apparmor.security.beta.kubernetes.io/trainer",
        "seccomp.security.alpha.kubernetes.io/pod",
        "container.seccomp.security.alpha.kubernetes.io/trainer",
    ],
)
def test_an_unconfining_annotation_is_refused_whatever_the_chart_allows(key: str) -> None:
    doc = base()
    doc["spec"]["roles"]["actor"]["annotations"] = {key: "unconfined", "example.com/team": "unconfined"}
    everything = AdmissionPolicy(allowed_volume_sources=VOLUME_SOURCES, allow_control_plane_tolerations=True)
    [found] = problems(doc, everything)
    assert found.startswith(f"spec.roles.actor.annotations[{key}]: an unconfined AppArmor or seccomp profile is refused")
    doc["spec"]["roles"]["actor"]["annotations"][key] = "runtime/default"
    assert problems(doc) == []


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/master", "operator": "Exists"},
        {"operator": "Exists"},
    ],
    ids=["control-plane", "master", "every-taint"],
)
def test_a_control_plane_toleration_is_refused_unless_the_chart_allows_it(toleration: dict[str, Any]) -> None:
    doc = base()
    doc["spec"]["roles"]["actor"]["tolerations"].append(toleration)
    [found] = problems(doc)
    assert found.startswith("spec.roles.actor.tolerations[1]: tolerates ") and "admission.allowControlPlaneTolerations" in found
    assert problems(doc, AdmissionPolicy(allow_control_plane_tolerations=True)) == []


def with_sandbox(sandbox: dict[str, Any]) -> dict[str, Any]:
    doc = base()
    doc["spec"]["rollout"]["multiTurn"] = {"tools": [{"name": "python"}], "maxTotalTokens": 256, "sandbox": sandbox}
    return doc


def test_sandbox_egress_is_refused_unless_the_chart_lists_the_network_as_written() -> None:
    # Any pod of the namespace may wear a job's sandbox label and borrow the egress the job opens.
    doc = with_sandbox({"egress": [{"cidr": "203.0.113.0/24", "ports": [{"port": 443}]}, {"cidr": "10.0.0.0/8"}]})
    found = problems(doc)
    assert [p.split(":")[0] for p in found] == [
        "spec.rollout.multiTurn.sandbox.egress[0].cidr",
        "spec.rollout.multiTurn.sandbox.egress[1].cidr",
    ]
    assert "(allowed: none)" in found[0] and "admission.allowedSandboxEgress" in found[0]
    assert [p.split(":")[0] for p in problems(doc, AdmissionPolicy(allowed_sandbox_egress=("203.0.113.0/24",)))] == [
        "spec.rollout.multiTurn.sandbox.egress[1].cidr"
    ]
    assert problems(doc, AdmissionPolicy(allowed_sandbox_egress=("203.0.113.0/24", "10.0.0.0/8"))) == []
    # A network inside an allowed one is still a different network: named as the chart lists it, or refused.
    assert problems(with_sandbox({"egress": [{"cidr": "10.1.0.0/16"}]}), AdmissionPolicy(allowed_sandbox_egress=("10.0.0.0/8",))) != []


def test_sandbox_dns_is_refused_unless_the_chart_allows_it() -> None:
    doc = with_sandbox({"dns": True})
    [found] = problems(doc)
    assert found.startswith("spec.rollout.multiTurn.sandbox.dns: ") and "admission.allowSandboxDNS" in found
    assert problems(doc, AdmissionPolicy(allow_sandbox_dns=True)) == []
    assert problems(with_sandbox({"dns": False})) == []


def test_every_role_is_checked() -> None:
    doc = base()
    doc["spec"]["algorithm"]["klCoef"] = 0.01
    doc["spec"]["roles"]["ref"] = {"replicas": 1, "runtimeClassName": "kata", "tolerations": [{"operator": "Exists"}]}
    assert [p.split(":")[0] for p in problems(doc)] == ["spec.roles.ref.runtimeClassName", "spec.roles.ref.tolerations[0]"]


# --- what needs the cluster ---------------------------------------------------------------------


def every_secret_reference() -> dict[str, Any]:
    """A job that names a Secret in every place a job can, each by a name of its own, and a ServiceAccount."""
    doc = base()
    spec = doc["spec"]
    spec["serviceAccountName"] = "trainer-sa"
    spec["imagePullSecrets"] = [{"name": "pull-secret"}]  # the kubelet's: no right needed, as for a pod
    spec["model"] = {"hubId": "org/model", "tokenSecretRef": {"name": "s-model", "key": "token"}}
    spec["cache"] = {"size": "10Gi"}
    spec["initializer"] = {"env": [{"name": "HTTPS_PROXY", "valueFrom": {"secretKeyRef": {"name": "s-initializer", "key": "url"}}}]}
    spec["volumes"] += [
        {"name": "secret", "secret": {"secretName": "s-volume"}},
        {
            "name": "projected",
            "projected": {
                "sources": [{"configMap": {"name": "m"}}, {"secret": {"name": "s-projected-1"}}, {"secret": {"name": "s-projected-2"}}]
            },
        },
        {"name": "csi", "csi": {"driver": "x.example.com", "nodePublishSecretRef": {"name": "s-csi"}}},
        {"name": "ceph", "cephfs": {"monitors": ["10.0.0.1"], "secretRef": {"name": "s-cephfs"}}},
    ]
    actor = spec["roles"]["actor"]
    actor["env"] = [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "a"}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "b"}}},
        {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "c"}}},
    ]
    actor["envFrom"] = [{"secretRef": {"name": "s-env-from"}}, {"configMapRef": {"name": "m"}}]
    spec["monitoring"]["tracking"] = [
        {"backend": "mlflow", "trackingUri": "https://mlflow.example.com", "tokenSecretRef": {"name": "s-mlflow", "key": "t"}},
        {"backend": "wandb", "project": "p", "apiKeySecretRef": {"name": "s-wandb", "key": "k"}},
    ]
    return doc


EVERY_SECRET = [
    "s-cephfs",
    "s-csi",
    "s-env",
    "s-env",
    "s-env-from",
    "s-initializer",
    "s-mlflow",
    "s-model",
    "s-projected-1",
    "s-projected-2",
    "s-volume",
    "s-wandb",
]


def test_every_secret_a_job_can_name_is_found_with_its_field() -> None:
    refs = secret_references(parse_rljob(every_secret_reference(), "job.yaml").spec)
    assert sorted(r.name for r in refs) == EVERY_SECRET
    fields = {r.field for r in refs}
    assert {
        "spec.model.tokenSecretRef",
        "spec.roles.actor.env[0].valueFrom.secretKeyRef",
        "spec.roles.actor.envFrom[0].secretRef",
        "spec.volumes[2].secret",
        "spec.volumes[3].projected.sources[1].secret",
        "spec.volumes[4].csi.nodePublishSecretRef",
        "spec.volumes[5].cephfs.secretRef",
        "spec.initializer.env[0].valueFrom.secretKeyRef",
        "spec.monitoring.tracking[1].apiKeySecretRef",
    } <= fields


def test_validate_says_what_it_leaves_to_the_cluster(tmp_path: Path) -> None:
    doc = every_secret_reference()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [sys.executable, "-m", "kuberl.operator.cli.commands", "validate", "--allow-volume-source", "cephfs", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    needs = [line for line in result.stdout.splitlines() if "needs the cluster" in line]
    assert len(needs) == 2
    assert "may create pods in the namespace (spec.serviceAccountName: trainer-sa" in needs[0]
    assert "may get Secret " + ", ".join(sorted(set(EVERY_SECRET))) + " (the pods read them)" in needs[1]
    assert cluster_checks(parse_rljob(base(), "x").spec) == []
    # The same file without the flag: the chart value is named, and the exit status says it failed.
    refused = subprocess.run(
        [sys.executable, "-m", "kuberl.operator.cli.commands", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1 and "spec.volumes[5].cephfs" in refused.stderr and "admission.allowedVolumeSources" in refused.stderr
    assert "Traceback" not in refused.stderr


# --- one definition: the chart's policy is kuberl's rules rendered as CEL -------------------------


def test_the_charts_policy_file_is_rendered_from_the_python_rules() -> None:
    assert (CHART / "files" / "admission-policy.json").read_text() == policy_json(), (
        "regenerate: make crd (or .venv/bin/python -m kuberl.operator.codegen.admission_policy > helm/kuberl/files/admission-policy.json)"
    )


def test_the_chart_values_are_the_python_contract() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["admission"]["properties"]
    assert schema["allowedVolumeSources"]["items"]["enum"] == list(VOLUME_SOURCES)
    values = yaml.safe_load((CHART / "values.yaml").read_text())["admission"]
    assert values == {
        "enabled": True,
        "allowedVolumeSources": [],
        "allowedRuntimeClasses": [],
        "allowControlPlaneTolerations": False,
        "allowedSandboxEgress": [],
        "allowSandboxDNS": False,
    }
    assert policy()["defaults"]["volumeSources"] == list(DEFAULT_VOLUME_SOURCES)
    template = (CHART / "templates" / "admission-policy.yaml").read_text()
    assert all(f"- name: {name}" in template for name in CHART_VARIABLES)


def test_the_policy_judges_an_update_only_when_a_field_that_grants_changes() -> None:
    # Those fields are immutable, so the operator's and `kuberl suspend`'s updates are never judged on rights they do not use.
    assert set(GRANTING_FIELDS) <= set(IMMUTABLE_FIELDS)
    [condition] = policy()["matchConditions"]
    old = {"spec": base()["spec"]}
    suspended = copy.deepcopy(old)
    suspended["spec"]["runPolicy"]["suspend"] = True
    widened = copy.deepcopy(old)
    widened["spec"]["volumes"][0] = {"name": "models", "hostPath": {"path": "/"}}
    assert evaluate(condition["expression"], {"object": suspended, "oldObject": old, "request": {"operation": "UPDATE"}}) == False  # noqa: E712
    assert evaluate(condition["expression"], {"object": widened, "oldObject": old, "request": {"operation": "UPDATE"}}) == True  # noqa: E712
    assert evaluate(condition["expression"], {"object": old, "oldObject": None, "request": {"operation": "CREATE"}}) == True  # noqa: E712


_ENV = celpy.Environment()
# The Kubernetes CEL functions the policy uses that cel-python lacks (strings ext join/split, lists indexOf).
_FUNCTIONS = {
    "join": lambda items, sep=celtypes.StringType(""): celtypes.StringType(str(sep).join(str(i) for i in items)),
    "split": lambda text, sep: celtypes.ListType([celtypes.StringType(p) for p in str(text).split(str(sep))]),
    "indexOf": lambda items, item: celtypes.IntType(list(items).index(item) if item in items else -1),
}


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    program = _ENV.program(_ENV.compile(expression), functions=_FUNCTIONS)
    result = program.evaluate({k: v if isinstance(v, celtypes.MapType) else celpy.json_to_cel(v) for k, v in activation.items()})
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"{expression[:200]}: {result}")
    return result


def static_verdicts(doc: dict[str, Any], allowed: AdmissionPolicy) -> list[bool]:
    """The policy's validations that ask no authorizer, evaluated as the API server would with the chart's values."""
    rendered = policy()
    variables: dict[str, Any] = {
        "allowedVolumeSources": list(allowed.volume_sources),
        "allowedRuntimeClasses": list(allowed.allowed_runtime_classes),
        "allowControlPlaneTolerations": allowed.allow_control_plane_tolerations,
        "allowedSandboxEgress": list(allowed.allowed_sandbox_egress),
        "allowSandboxDNS": allowed.allow_sandbox_dns,
    }
    activation = {"object": doc, "request": {"operation": "CREATE", "namespace": "team", "userInfo": {"username": "u"}}}
    for variable in rendered["variables"]:
        if "authorizer" not in variable["expression"]:
            variables[variable["name"]] = evaluate(variable["expression"], {**activation, "variables": _cel(variables)})
    static = [v for v in rendered["validations"] if "authorizer" not in v["expression"] and "mayGetEverySecret" not in v["expression"]]
    assert len(static) == 7
    return [bool(evaluate(v["expression"], {**activation, "variables": _cel(variables)})) for v in static]


def _cel(variables: dict[str, Any]) -> celtypes.MapType:
    return celtypes.MapType(
        {
            celtypes.StringType(k): v if isinstance(v, (celtypes.ListType, celtypes.MapType)) else celpy.json_to_cel(v)
            for k, v in variables.items()
        }
    )


def _admission_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = [
        (p.stem, read_documents(p.read_text(), str(p))[0].content)
        for p in sorted((REPO / "tests" / "manifests" / "bad").glob("cluster-*.yaml"))
        if "chart's admission policy refuses it" in p.read_text()
    ]
    assert len(cases) >= 7
    gvisor = base()
    gvisor["spec"]["roles"]["actor"]["runtimeClassName"] = "gvisor"
    egress = with_sandbox({"egress": [{"cidr": "203.0.113.0/24"}, {"cidr": "2001:db8::/32", "ports": [{"port": 443}]}], "dns": True})
    return [
        *cases,
        ("base", base()),
        ("every-secret", every_secret_reference()),
        ("gvisor", gvisor),
        ("sandbox-egress", egress),
        ("sandbox-no-egress", with_sandbox({})),
    ]


@pytest.mark.parametrize(
    "allowed",
    [
        AdmissionPolicy(),
        AdmissionPolicy(allowed_volume_sources=("hostPath", "cephfs"), allowed_runtime_classes=("gvisor",)),
        AdmissionPolicy(allowed_volume_sources=("hostPath",), allowed_sandbox_egress=("203.0.113.0/24",), allow_sandbox_dns=True),
        AdmissionPolicy(
            allowed_volume_sources=VOLUME_SOURCES,
            allowed_runtime_classes=("kata", "gvisor"),
            allow_control_plane_tolerations=True,
            allowed_sandbox_egress=("2001:db8::/32", "203.0.113.0/24"),
            allow_sandbox_dns=True,
        ),
    ],
    ids=["defaults", "some", "some-egress", "everything"],
)
def test_the_policys_cel_and_kuberl_validate_agree(allowed: AdmissionPolicy) -> None:
    verdicts = {}
    for name, doc in _admission_cases():
        python_ok = not problems(doc, allowed)
        cel_ok = all(static_verdicts(doc, allowed))
        verdicts[name] = (python_ok, cel_ok)
    assert all(p == c for p, c in verdicts.values()), {n: v for n, v in verdicts.items() if v[0] != v[1]}
    assert any(not p for p, _ in verdicts.values()) or allowed.allow_control_plane_tolerations  # the corpus has refusals to agree on


def test_the_policys_secret_list_is_the_python_one() -> None:
    doc = every_secret_reference()
    [variable] = [v for v in policy()["variables"] if v["name"] == "secretNames"]
    names = evaluate(variable["expression"], {"object": doc})
    assert sorted(str(n) for n in names) == EVERY_SECRET
    assert list(evaluate(variable["expression"], {"object": base()})) == []


def test_the_policy_checks_each_secret_once_within_the_api_servers_budget() -> None:
    # An authorizer check costs 350000 of the 10^7 a request may spend and of the 10^6 one expression may:
    # one per expression, each name once, and at most MAX of them.
    from kuberl.operator.validation.admission import MAX_CHECKED_SECRET_REFERENCES

    validations = policy()["validations"]
    assert all(v["expression"].count(".check(") <= 2 for v in validations)
    per_name = [v for v in validations if ".name(variables.secretNames[" in v["expression"]]
    assert len(per_name) == MAX_CHECKED_SECRET_REFERENCES
    assert (MAX_CHECKED_SECRET_REFERENCES + 2) * 350_000 < 10_000_000


def test_kuberl_submit_leaves_the_allow_lists_to_the_cluster() -> None:
    # The cluster's chart may allow more than the defaults; its admission policy and operator apply its values.
    from kuberl.operator.validation.cluster_rules import cluster_problems

    job = parse_rljob(with_volume({"hostPath": {"path": "/srv"}}), "job.yaml")
    assert [p.path for p in cluster_problems(job, "job.yaml")] == ["spec.volumes[2].hostPath"]
    assert cluster_problems(job, "job.yaml", policy=None) == []


def test_the_operator_takes_the_charts_allow_lists_as_flags() -> None:
    from kuberl.operator.cli.commands import _admission_policy, build_parser

    args = build_parser().parse_args(
        [
            "operator",
            "--allow-volume-source=hostPath",
            "--allow-volume-source=nfs",
            "--allow-runtime-class=gvisor",
            "--allow-control-plane-tolerations",
            "--allow-sandbox-egress=203.0.113.0/24",
            "--allow-sandbox-dns",
        ]
    )
    assert _admission_policy(args) == AdmissionPolicy(("hostPath", "nfs"), ("gvisor",), True, ("203.0.113.0/24",), True)
    assert _admission_policy(build_parser().parse_args(["operator"])) == AdmissionPolicy()
    with pytest.raises(SystemExit):  # a source that no PodSpec has is refused at once
        build_parser().parse_args(["operator", "--allow-volume-source=hostpath"])
    with pytest.raises(SystemExit):  # as is a network with host bits set, which no job's egress could name
        build_parser().parse_args(["operator", "--allow-sandbox-egress=203.0.113.7/24"])


def test_the_policy_holds_the_tool_sandbox_pods_runtime_class_to_the_same_allow_list() -> None:
    doc = base()
    doc["spec"]["rollout"]["multiTurn"] = {"sandbox": {"runtimeClassName": "kata"}}  # what the API server passes on
    assert static_verdicts(doc, AdmissionPolicy()) == [True, True, False, True, True, True, True]
    assert all(static_verdicts(doc, AdmissionPolicy(allowed_runtime_classes=("gvisor", "kata"))))


def test_a_rollout_role_of_its_own_is_checked_and_its_own_tolerations_too() -> None:
    # roles.rollout (placement: separate) sets its pods' placement only; the rest of its pods is the actor's.
    doc = base()
    doc["spec"]["rollout"]["placement"] = "separate"
    doc["spec"]["roles"]["rollout"] = {"replicas": 1, "nodeSelector": {"pool": "inference"}}
    assert problems(doc) == []
    doc["spec"]["roles"]["rollout"]["tolerations"] = [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]
    [found] = problems(doc)
    assert (
        found.startswith("spec.roles.rollout.tolerations[0]: tolerates the control-plane taint") and "allowControlPlaneTolerations" in found
    )
    assert problems(doc, AdmissionPolicy(allow_control_plane_tolerations=True)) == []

"""An RLJob grants its creator no more than a pod they could create, on the real API server: the chart's
ValidatingAdmissionPolicy asks the authorizer about the request's user (impersonated here by the admin),
and refuses what the chart's allow-lists do not name; the operator refuses the same job by itself where
no policy is installed. The same rules offline: tests/test_admission.py."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kuberl.operator.validation.admission import DEFAULT_VOLUME_SOURCES
from kuberl.operator.api import GROUP, PLURAL, VERSION
from kuberl.operator.testing.rljobs import small_job, wait_phase
from kuberl.operator.testing.waiting import eventually

REPO = Path(__file__).resolve().parent.parent.parent
CHART = REPO / "helm" / "kuberl"
RELEASE, RELEASE_NAMESPACE = "kuberl-admission", "kuberl-admission"
IMAGES = [
    "--set",
    "image.repository=registry.example.com/team/kuberl-operator,trainerImage=registry.example.com/team/kuberl-trainer:0.1.0-cpu",
]
SECRET = "hub-token"


def host_path_job(name: str) -> dict[str, Any]:
    return small_job(name, volumes=[{"name": "data", "hostPath": {"path": "/", "type": "Directory"}}])


def secret_job(name: str) -> dict[str, Any]:
    job = small_job(name)
    job["spec"]["roles"]["actor"]["env"] = [{"name": "HUB", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "token"}}}]
    return job


def service_account_job(name: str) -> dict[str, Any]:
    return small_job(name, serviceAccountName="default")


def as_user(plane, user: str) -> client.CustomObjectsApi:
    api = plane.api_client()
    api.set_default_header("Impersonate-User", user)
    return client.CustomObjectsApi(api)


def create(api: client.CustomObjectsApi, namespace: str, job: dict[str, Any], dry_run: bool = True) -> dict[str, Any]:
    return api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, copy.deepcopy(job), **({"dry_run": "All"} if dry_run else {})
    )


def refusal(api: client.CustomObjectsApi, namespace: str, job: dict[str, Any]) -> str | None:
    """The API server's message when it refuses `job` (a dry run), None when it accepts it."""
    try:
        create(api, namespace, job)
    except ApiException as exc:
        assert exc.status in (403, 422), exc.body
        return json.loads(exc.body)["message"]
    return None


# --- the operator, with no policy installed: defence in depth ------------------------------------


def test_the_operator_refuses_a_host_path_job_by_itself(control_plane, operator) -> None:
    from kuberl.operator.testing.rljobs import create as create_job
    from kuberl.operator.testing.rljobs import new_namespace

    namespace = new_namespace(control_plane, "adm-operator")
    create_job(control_plane, namespace, host_path_job("node-root"))
    status = wait_phase(control_plane, namespace, "node-root", "Failed", timeout=60)
    [condition] = [c for c in status["conditions"] if c["reason"] == "InvalidSpec"]
    assert "spec.volumes[0].hostPath" in condition["message"] and "admission.allowedVolumeSources" in condition["message"]
    pods = client.CoreV1Api(control_plane.api_client()).list_namespaced_pod(namespace).items
    assert pods == []  # nothing was made for it


# --- the chart's policy ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy(control_plane, rljob_crd):
    """The chart installed with its admission policy, and the policy in force (it loads a moment after it is made)."""
    plane = control_plane
    plane.helm("install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace", *IMAGES)
    rendered = plane.kubectl("get", "validatingadmissionpolicy", "-o", "json").stdout
    [made] = [p for p in json.loads(rendered)["items"] if p["metadata"]["name"].startswith(RELEASE_NAMESPACE)]
    probe = plane.api_client()
    namespace = f"adm-probe-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(probe).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    eventually(
        lambda: refusal(client.CustomObjectsApi(probe), namespace, host_path_job("probe")) is not None,
        60,
        "the admission policy to be in force",
    )
    yield made
    plane.helm("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", check=False)


@pytest.fixture(scope="module")
def tenants(control_plane, policy) -> str:
    """A namespace with three users: creator may only make RLJobs; trusted may also create pods and get the one
    Secret (by name); reader may get every Secret but create no pods."""
    admin = control_plane.api_client()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    namespace = f"adm-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    core.create_namespaced_secret(namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=SECRET), string_data={"token": "t"}))
    roles = {
        "rljobs": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create", "get", "list", "patch", "update"]}],
        "pods": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
        "the-secret": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET], "verbs": ["get"]}],
        "every-secret": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    bindings = {"creator": ["rljobs"], "trusted": ["rljobs", "pods", "the-secret"], "reader": ["rljobs", "every-secret"]}
    for role, rules in roles.items():
        rbac.create_namespaced_role(
            namespace, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": role}, "rules": rules}
        )
    for user, granted in bindings.items():
        for role in granted:
            rbac.create_namespaced_role_binding(
                namespace,
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": f"{user}-{role}"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
                },
            )
    return namespace


def test_the_chart_renders_the_default_volume_sources_from_kuberls_definition(policy) -> None:
    [variable] = [v for v in policy["spec"]["variables"] if v["name"] == "allowedVolumeSources"]
    assert json.loads(variable["expression"]) == list(DEFAULT_VOLUME_SOURCES)
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_a_user_who_may_only_create_rljobs_is_refused_a_secret_and_a_service_account(control_plane, tenants) -> None:
    creator = as_user(control_plane, "creator")
    said = refusal(creator, tenants, secret_job("secret"))
    assert said is not None and f"Secret {SECRET}, which creator may not get in namespace {tenants}" in said
    said = refusal(creator, tenants, service_account_job("service-account"))
    assert said is not None and "spec.serviceAccountName: creator may not create pods" in said
    # Through the operator they still get what a pod of theirs would: a job that names neither is accepted.
    assert refusal(creator, tenants, small_job("plain")) is None


def test_the_same_rljobs_are_accepted_for_a_user_who_may_create_pods_and_get_the_secret(control_plane, tenants) -> None:
    trusted = as_user(control_plane, "trusted")
    assert refusal(trusted, tenants, secret_job("secret")) is None  # get on that Secret by name: checked by name
    assert refusal(trusted, tenants, service_account_job("service-account")) is None
    both = secret_job("both")
    both["spec"]["serviceAccountName"] = "default"
    assert refusal(trusted, tenants, both) is None
    # Another Secret's name is not covered by a right on this one.
    other = secret_job("other")
    other["spec"]["roles"]["actor"]["envFrom"] = [{"secretRef": {"name": "someone-elses"}}]
    said = refusal(trusted, tenants, other)
    assert said is not None and "Secret someone-elses, which trusted may not get" in said


def test_a_user_who_may_get_every_secret_is_checked_once_whatever_the_count(control_plane, tenants) -> None:
    reader = as_user(control_plane, "reader")
    many = small_job("many-secrets")
    many["spec"]["roles"]["actor"]["env"] = [
        {"name": f"S{i}", "valueFrom": {"secretKeyRef": {"name": f"secret-{i}", "key": "k"}}} for i in range(40)
    ]
    assert refusal(reader, tenants, many) is None
    said = refusal(reader, tenants, service_account_job("service-account"))
    assert said is not None and "may not create pods" in said


def test_an_update_that_grants_nothing_new_is_not_judged_on_rights(control_plane, tenants) -> None:
    # The trusted user makes a job that names the Secret; the creator, who may not get it, may still suspend it.
    create(as_user(control_plane, "trusted"), tenants, secret_job("suspendable"), dry_run=False)
    creator = as_user(control_plane, "creator")
    creator.patch_namespaced_custom_object(GROUP, VERSION, tenants, PLURAL, "suspendable", {"spec": {"runPolicy": {"suspend": True}}})
    job = creator.get_namespaced_custom_object(GROUP, VERSION, tenants, PLURAL, "suspendable")
    assert job["spec"]["runPolicy"]["suspend"] is True


def test_a_host_path_volume_is_refused_by_default_and_accepted_when_the_chart_allows_it(control_plane, tenants) -> None:
    admin = client.CustomObjectsApi(control_plane.api_client())
    said = refusal(admin, tenants, host_path_job("node-root"))  # even for the cluster admin: the chart's allow-list is the rule
    assert said is not None and "spec.volumes: data use a volume source that is not allowed" in said
    assert "admission.allowedVolumeSources" in said
    control_plane.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--reuse-values",
        "--set",
        "admission.allowedVolumeSources={hostPath}",
    )
    try:
        eventually(lambda: refusal(admin, tenants, host_path_job("node-root")) is None, 60, "the widened policy to be in force")
        # The operator is told the same: the chart passes the allow-list to it.
        deployment = client.AppsV1Api(control_plane.api_client()).read_namespaced_deployment(RELEASE, RELEASE_NAMESPACE)
        assert "--allow-volume-source=hostPath" in deployment.spec.template.spec.containers[0].args
        # gitRepo stays refused: the chart named only hostPath.
        git = small_job("git", volumes=[{"name": "data", "gitRepo": {"repository": "https://example.com/x.git"}}])
        assert "not allowed" in (refusal(admin, tenants, git) or "")
    finally:
        control_plane.helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            RELEASE_NAMESPACE,
            "--reuse-values",
            "--set",
            "admission.allowedVolumeSources=null",
        )


@pytest.mark.parametrize("change", ["runtime-class", "apparmor", "control-plane", "rollout-control-plane"])
def test_privileged_settings_are_refused_by_the_policy(control_plane, tenants, change: str) -> None:
    job = small_job(f"privileged-{change}")
    actor = job["spec"]["roles"]["actor"]
    if change == "rollout-control-plane":  # the fleet's own placement (rollout.placement: separate) is held to the same
        job["spec"].setdefault("rollout", {})["placement"] = "separate"
        job["spec"]["roles"]["rollout"] = {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}
    if change == "runtime-class":
        actor["runtimeClassName"] = "runc-unsandboxed"
        expected = "runtimeClassName: not an allowed RuntimeClass (allowed: none)"
    elif change == "apparmor":
        actor["annotations"] = {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}
        expected = "an unconfined AppArmor or seccomp profile is refused"
    elif change == "control-plane":
        actor["tolerations"] = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]
        expected = "admission.allowControlPlaneTolerations"
    else:
        expected = "admission.allowControlPlaneTolerations"
    said = refusal(client.CustomObjectsApi(control_plane.api_client()), tenants, job)
    assert said is not None and expected in said, said


def test_the_policy_is_rendered_with_the_chart_values(control_plane) -> None:
    result = control_plane.helm(
        "template",
        "x",
        str(CHART),
        "--kube-version",
        "1.37.2",
        *IMAGES,
        "--set",
        "admission.allowedVolumeSources={nfs,hostPath},admission.allowedRuntimeClasses={gvisor},"
        "admission.allowControlPlaneTolerations=true,admission.allowedSandboxEgress={203.0.113.0/24},"
        "admission.allowSandboxDNS=true",
    )
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    [vap] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    variables = {v["name"]: v["expression"] for v in vap["spec"]["variables"]}
    assert json.loads(variables["allowedVolumeSources"]) == [*DEFAULT_VOLUME_SOURCES, "nfs", "hostPath"]
    assert json.loads(variables["allowedRuntimeClasses"]) == ["gvisor"] and variables["allowControlPlaneTolerations"] == "true"
    assert json.loads(variables["allowedSandboxEgress"]) == ["203.0.113.0/24"] and variables["allowSandboxDNS"] == "true"
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {
        "--allow-volume-source=nfs",
        "--allow-volume-source=hostPath",
        "--allow-runtime-class=gvisor",
        "--allow-control-plane-tolerations",
        "--allow-sandbox-egress=203.0.113.0/24",
        "--allow-sandbox-dns",
    } <= set(args)
    off = control_plane.helm("template", "x", str(CHART), "--kube-version", "1.37.2", *IMAGES, "--set", "admission.enabled=false")
    assert "ValidatingAdmissionPolicy" not in off.stdout
    bad = control_plane.helm(
        "template", "x", str(CHART), "--kube-version", "1.37.2", *IMAGES, "--set", "admission.allowedVolumeSources={hostpath}", check=False
    )
    assert bad.returncode != 0 and "allowedVolumeSources" in bad.stderr


def test_a_user_limited_to_named_secrets_is_checked_name_by_name_within_the_api_servers_budget(control_plane, tenants) -> None:
    from kuberl.operator.validation.admission import MAX_CHECKED_SECRET_REFERENCES

    names = [f"named-{i}" for i in range(MAX_CHECKED_SECRET_REFERENCES + 1)]
    rbac = client.RbacAuthorizationV1Api(control_plane.api_client())
    rbac.create_namespaced_role(
        tenants,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "named"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": names, "verbs": ["get"]}],
        },
    )
    for role in ("rljobs", "named"):
        rbac.create_namespaced_role_binding(
            tenants,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"named-user-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "named-user"}],
            },
        )

    def naming(count: int) -> dict[str, Any]:
        job = small_job(f"names-{count}")
        job["spec"]["roles"]["actor"]["env"] = [
            {"name": f"S{i}", "valueFrom": {"secretKeyRef": {"name": n, "key": "k"}}} for i, n in enumerate(names[:count])
        ]
        return job

    user = as_user(control_plane, "named-user")
    # Every name its own authorizer check: the most the policy makes fits the API server's budget.
    eventually(lambda: refusal(user, tenants, naming(MAX_CHECKED_SECRET_REFERENCES)) is None, 30, "the user's Role to be in force")
    said = refusal(user, tenants, naming(MAX_CHECKED_SECRET_REFERENCES + 1))
    assert said is not None and f"checks at most {MAX_CHECKED_SECRET_REFERENCES} one by one" in said

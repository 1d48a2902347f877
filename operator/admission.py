"""What an RLJob may ask of its pods beyond what its creator could ask of a pod: the allow-lists.

An RLJob's creator is trusted exactly as much as a pod creator in its namespace, but the operator makes
the pods with its own rights. So an RLJob must not reach the node (hostPath, gitRepo and the other
volume sources that mount what the node or a remote server holds), run under a RuntimeClass the admin did
not choose, unconfine its AppArmor or seccomp profile, or land on the control plane, unless the chart
allows it. Those rules are defined here, once: `admission_problems` is the Python check (`kuberl validate`
and the operator, which refuses such a job with an InvalidSpec condition) and `policy()` renders the same
rules as the CEL of the chart's ValidatingAdmissionPolicy (helm/kuberl/files/admission-policy.json, which
its template reads and adds the chart's allow-lists to).

What only the API server can know (whether the request's user may get each Secret the job names, and
create pods when it names a ServiceAccount) is the policy's alone: `cluster_checks` says what it will ask.

Regenerate the chart's copy after changing this file:
    .venv/bin/python -m kuberl.operator.admission > helm/kuberl/files/admission-policy.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import BaseModel

from kuberl.engine.config import SecretKeyRef

from .api import GROUP, PLURAL, RLJob, RLJobSpec, kube_types
from .problems import Problem

# --- the contract: defaults, and the chart values that widen them ------------------------------------

DEFAULT_VOLUME_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "ephemeral", "projected", "csi", "image",
                          "downwardAPI")
"""Volume sources whose data comes from the namespace's own objects, the pod itself or the cluster's storage
drivers, never from the node's filesystem or a server the pod's creator names (hostPath, gitRepo, nfs, iscsi,
...): the sources Pod Security's `restricted` profile allows."""
VOLUME_SOURCES = tuple(info.alias for name, info in kube_types.Volume.model_fields.items() if name != "name")
"""Every volume source of a PodSpec, as the API spells it (what the chart value may name)."""

CONTROL_PLANE_TAINTS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")

# Annotations that select a pod's or container's AppArmor or seccomp profile; "unconfined" switches it off.
PROFILE_ANNOTATION_PREFIXES = ("container.apparmor.security.beta.kubernetes.io/", "container.seccomp.security.alpha.kubernetes.io/")
PROFILE_ANNOTATION_KEYS = ("seccomp.security.alpha.kubernetes.io/pod",)
UNCONFINED = "unconfined"

VALUE_VOLUME_SOURCES = "admission.allowedVolumeSources"
VALUE_RUNTIME_CLASSES = "admission.allowedRuntimeClasses"
VALUE_CONTROL_PLANE = "admission.allowControlPlaneTolerations"

MAX_CHECKED_SECRET_REFERENCES = 24
"""Secret references (counting repeats) the policy checks one by one for a user who may get only some of the
namespace's Secrets: each check costs 350000 of the API server's CEL budget of 10^7 per request. A user who
may get every Secret of the namespace is checked once, whatever the count."""

# The spec fields through which a job names a Secret, a ServiceAccount or a privileged setting. All are
# immutable once the job exists (spec.IMMUTABLE_FIELDS), so the policy judges a CREATE, and an UPDATE only
# if one of them changes: the operator's and `kuberl suspend`'s updates are not asked for rights they never use.
GRANTING_FIELDS = ("model", "tokenizer", "reward", "roles", "monitoring", "serviceAccountName", "volumes", "initializer")


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the chart allows beyond the defaults (its `admission` values; the operator's --allow-* flags)."""

    allowed_volume_sources: tuple[str, ...] = ()
    """Added to DEFAULT_VOLUME_SOURCES."""
    allowed_runtime_classes: tuple[str, ...] = ()
    """The RuntimeClasses a role may name; empty: none. A RuntimeClass picks the container runtime and may add
    tolerations and a node selector of its own (its scheduling section), so which ones a tenant may use is the
    admin's call: typically a gVisor or Kata class, or the NVIDIA runtime's."""
    allow_control_plane_tolerations: bool = False

    @property
    def volume_sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(DEFAULT_VOLUME_SOURCES + self.allowed_volume_sources))


# --- the Python check ------------------------------------------------------------------------------


def _source_of(volume: kube_types.Volume) -> str:
    return next(info.alias for name, info in type(volume).model_fields.items() if name != "name" and getattr(volume, name) is not None)


def _tolerates_control_plane(t: Any) -> bool:
    # An empty key with operator Exists tolerates every taint, the control plane's included.
    return t.key is None or t.key in CONTROL_PLANE_TAINTS


def unconfining(key: str, value: str) -> bool:
    """Whether a pod annotation switches its AppArmor or seccomp profile off."""
    return value == UNCONFINED and (key in PROFILE_ANNOTATION_KEYS or key.startswith(PROFILE_ANNOTATION_PREFIXES))


def admission_problems(job: RLJob, source: str, policy: AdmissionPolicy = AdmissionPolicy()) -> list[Problem]:
    """What the chart's allow-lists refuse in `job` (the checks that need no cluster)."""
    spec = job.spec
    problems: list[Problem] = []
    sources = policy.volume_sources
    for i, volume in enumerate(spec.volumes):
        kind = _source_of(volume)
        if kind not in sources:
            problems.append(Problem(source, f"spec.volumes[{i}].{kind}", f"volume {volume.name}: {kind} is not an allowed volume source "
                                    f"(allowed: {', '.join(sources)}): it would give the pods what a pod's creator may not reach "
                                    f"through the job; use a persistentVolumeClaim, or ask the cluster admin to add {kind} to the "
                                    f"chart value {VALUE_VOLUME_SOURCES}"))
    for role, pods in spec.roles.present().items():
        where = f"spec.roles.{role}"
        if pods.runtime_class_name is not None and pods.runtime_class_name not in policy.allowed_runtime_classes:
            allowed = ", ".join(policy.allowed_runtime_classes) or "none"
            problems.append(Problem(source, f"{where}.runtimeClassName", f"RuntimeClass {pods.runtime_class_name} is not allowed "
                                    f"(allowed: {allowed}): leave it out, or ask the cluster admin to add it to the chart value "
                                    f"{VALUE_RUNTIME_CLASSES}"))
        for key, value in (pods.annotations or {}).items():
            if unconfining(key, value):
                problems.append(Problem(source, f"{where}.annotations[{key}]", "an unconfined AppArmor or seccomp profile is refused: "
                                        "kuberl's pods always run under the runtime's default profiles; remove the annotation"))
        for i, toleration in enumerate(pods.tolerations or []):
            if not policy.allow_control_plane_tolerations and _tolerates_control_plane(toleration):
                what = f"the control-plane taint {toleration.key}" if toleration.key else "every taint (an empty key with operator Exists)"
                problems.append(Problem(source, f"{where}.tolerations[{i}]", f"tolerates {what}, which puts the job's pods on the "
                                        f"control plane's nodes: tolerate your GPU pool's own taints, or ask the cluster admin "
                                        f"to set the chart value {VALUE_CONTROL_PLANE}"))
    return problems


# --- what only the cluster can check ---------------------------------------------------------------


@dataclass(frozen=True)
class SecretReference:
    field: str
    """Where the job names it, e.g. spec.roles.actor.env[0].valueFrom.secretKeyRef."""
    name: str


def _alias(model: BaseModel, name: str) -> str:
    return type(model).model_fields[name].alias or name


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any, str]]:
    """(path, model, attribute) for every field of every model under `value`."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            child = getattr(value, name)
            yield path, value, name
            yield from _walk(child, f"{path}.{_alias(value, name)}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}[{key}]")


# The types and fields that name a Secret of the namespace; what the pods (or the kubelet for them) then read.
_SECRET_NAME_FIELDS: dict[type, str] = {
    SecretKeyRef: "name",                      # model/tokenizer/reward.model tokenSecretRef, tracking credentials
    kube_types.SecretKeySelector: "name",      # env valueFrom.secretKeyRef
    kube_types.SecretEnvSource: "name",        # envFrom secretRef
    kube_types.SecretProjection: "name",       # projected volume sources
    kube_types.SecretVolumeSource: "secret_name",
    kube_types.AzureFileVolumeSource: "secret_name",
}
# Volume sources' references to the Secret their driver reads (csi's node-publish secret, cephfs, rbd, ...).
_SECRET_REF_ATTRIBUTES = ("secret_ref", "node_publish_secret_ref")


def secret_references(spec: RLJobSpec) -> list[SecretReference]:
    """Every Secret of its namespace that the job's pods read (imagePullSecrets aside: the kubelet uses those
    to pull, and a pod's creator needs no right on them either)."""
    found: list[SecretReference] = []
    for path, model, attr in _walk(spec, "spec"):
        value = getattr(model, attr)
        if _SECRET_NAME_FIELDS.get(type(model)) == attr and value:
            found.append(SecretReference(path, value))
        elif attr in _SECRET_REF_ATTRIBUTES and isinstance(value, kube_types.LocalObjectReference) and value.name:
            found.append(SecretReference(f"{path}.{_alias(model, attr)}", value.name))
    return found


def cluster_checks(spec: RLJobSpec) -> list[str]:
    """What the chart's admission policy will also ask the API server about this job (nothing offline can)."""
    checks = []
    if spec.service_account_name is not None:
        checks.append(f"that you may create pods in the namespace (spec.serviceAccountName: {spec.service_account_name} runs the "
                      "pods with that ServiceAccount's rights)")
    names = sorted({r.name for r in secret_references(spec)})
    if names:
        checks.append(f"that you may get Secret {', '.join(names)} (the pods read {'it' if len(names) == 1 else 'them'})")
    return checks


# --- the same rules as the CEL of a ValidatingAdmissionPolicy ---------------------------------------

_ROLES = ("actor", "critic", "ref", "reward")
_SPEC = "object.spec"
_IN_NAMESPACE = "authorizer.group('').resource('{resource}').namespace(request.namespace)"
# Variables the chart's template defines from its values (helm/kuberl/templates/admission-policy.yaml).
CHART_VARIABLES = ("allowedVolumeSources", "allowedRuntimeClasses", "allowControlPlaneTolerations")


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _names(items: str, guard: str, name: str) -> str:
    """CEL: the list of `name` of each element of the list `items` (maybe absent) that has it."""
    return f"({items}.filter(x, {guard}).map(x, {name}))"


def _optional(path: str, list_expr: str) -> str:
    """CEL: `list_expr` when every step of `path` (object.spec.a.b) is there, else []."""
    parts = path.split(".")
    guards = [f"has({'.'.join(parts[:i + 1])})" for i in range(2, len(parts))]
    return f"({' && '.join(guards)} ? {list_expr} : [])"


def _secret_names_cel() -> str:
    vols = f"{_SPEC}.volumes"
    per_volume = " + ".join([
        "(has(v.secret) && has(v.secret.secretName) ? [v.secret.secretName] : [])",
        "(has(v.azureFile) ? [v.azureFile.secretName] : [])",
        "(has(v.csi) && has(v.csi.nodePublishSecretRef) && has(v.csi.nodePublishSecretRef.name) ? [v.csi.nodePublishSecretRef.name] : [])",
        # The source (cephfs, rbd, iscsi, flexVolume, scaleIO, storageos) whose driver reads a Secret.
        "v.filter(k, k != 'name' && 'secretRef' in v[k] && 'name' in v[k].secretRef).map(k, v[k].secretRef.name)",
        "(has(v.projected) && has(v.projected.sources) ? v.projected.sources.filter(p, has(p.secret) && has(p.secret.name))"
        ".map(p, p.secret.name) : [])",
    ])
    # CEL before Kubernetes 1.34 cannot flatten a list of lists; names never hold a comma, so join and split do.
    parts = [_optional(vols, f"{vols}.map(v, ({per_volume}).join(',')).join(',').split(',').filter(n, n != '')")]
    env_ref = _names("{}", "has(x.valueFrom) && has(x.valueFrom.secretKeyRef) && has(x.valueFrom.secretKeyRef.name)",
                     "x.valueFrom.secretKeyRef.name")
    env_from = _names("{}", "has(x.secretRef) && has(x.secretRef.name)", "x.secretRef.name")
    for role in _ROLES:
        parts.append(_optional(f"{_SPEC}.roles.{role}.env", env_ref.format(f"{_SPEC}.roles.{role}.env")))
        parts.append(_optional(f"{_SPEC}.roles.{role}.envFrom", env_from.format(f"{_SPEC}.roles.{role}.envFrom")))
    parts.append(_optional(f"{_SPEC}.initializer.env", env_ref.format(f"{_SPEC}.initializer.env")))
    for weights in ("model", "tokenizer", "reward.model"):
        parts.append(_optional(f"{_SPEC}.{weights}.tokenSecretRef", f"[{_SPEC}.{weights}.tokenSecretRef.name]"))
    tracking = f"{_SPEC}.monitoring.tracking"
    for ref in ("tokenSecretRef", "apiKeySecretRef"):
        parts.append(_optional(tracking, _names(tracking, f"has(x.{ref})", f"x.{ref}.name")))
    return " + ".join(parts)


def _roles_cel() -> str:
    # dyn(): the API server's CEL wants a map literal's values of one type.
    return " + ".join(f"(has({_SPEC}.roles.{r}) ? [{{'name': dyn('{r}'), 'pods': {_SPEC}.roles.{r}}}] : [])" for r in _ROLES)


def _changed_cel() -> str:
    changed = [f"has(object.spec.{f}) != has(oldObject.spec.{f}) || (has(object.spec.{f}) && object.spec.{f} != oldObject.spec.{f})"
               for f in GRANTING_FIELDS]
    return "request.operation == 'CREATE' || " + " || ".join(f"({c})" for c in changed)


_UNCONFINING_CEL = "r.pods.annotations[k] == '{u}' && ({keys} || {prefixes})".format(
    u=UNCONFINED, keys=" || ".join(f"k == '{k}'" for k in PROFILE_ANNOTATION_KEYS),
    prefixes=" || ".join(f"k.startsWith('{p}')" for p in PROFILE_ANNOTATION_PREFIXES))
_CONTROL_PLANE_CEL = f"!has(t.key) || t.key in {_cel_list(CONTROL_PLANE_TAINTS)}"


def _secret_slot(i: int) -> dict[str, str]:
    name = f"variables.secretNames[{i}]"
    return {
        "expression": f"size(variables.secretNames) <= {i} || variables.secretNames.indexOf({name}) < {i}"
                      f" || variables.mayGetEverySecret || {_IN_NAMESPACE.format(resource='secrets')}.name({name}).check('get').allowed()",
        "messageExpression": f"'the RLJob names Secret ' + {name} + ', which ' + request.userInfo.username + ' may not get in namespace ' "
                             f"+ request.namespace + ': its pods would read it for you; ask for get on it, or leave it out'",
        "reason": "Forbidden",
    }


def policy() -> dict[str, Any]:
    """The parts of the chart's ValidatingAdmissionPolicy that do not depend on its values (its template adds
    CHART_VARIABLES first)."""
    validations = [
        {
            "expression": f"!has({_SPEC}.volumes) || {_SPEC}.volumes.all(v, v.all(k, k == 'name' || k in variables.allowedVolumeSources))",
            "messageExpression": f"'spec.volumes: ' + {_SPEC}.volumes.filter(v, !v.all(k, k == 'name' || k in variables.allowedVolumeSources))"
                                 ".map(v, v.name).join(', ') + ' use a volume source that is not allowed (allowed: ' + "
                                 f"variables.allowedVolumeSources.join(', ') + '); the cluster admin may add it to the chart value "
                                 f"{VALUE_VOLUME_SOURCES}'",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.roles.all(r, !has(r.pods.runtimeClassName) || r.pods.runtimeClassName in variables.allowedRuntimeClasses)",
            "messageExpression": "'spec.roles.' + variables.roles.filter(r, has(r.pods.runtimeClassName) && !(r.pods.runtimeClassName in "
                                 "variables.allowedRuntimeClasses)).map(r, r.name).join(', ') + '.runtimeClassName: not an allowed RuntimeClass "
                                 "(allowed: ' + (size(variables.allowedRuntimeClasses) == 0 ? 'none' : variables.allowedRuntimeClasses.join(', ')) "
                                 f"+ '); the cluster admin may add it to the chart value {VALUE_RUNTIME_CLASSES}'",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.roles.all(r, !has(r.pods.annotations) || !r.pods.annotations.exists(k, {_UNCONFINING_CEL}))",
            "message": "spec.roles.*.annotations: an unconfined AppArmor or seccomp profile is refused; kuberl's pods always run under "
                       "the runtime's default profiles",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.allowControlPlaneTolerations || variables.roles.all(r, !has(r.pods.tolerations) || "
                          f"!r.pods.tolerations.exists(t, {_CONTROL_PLANE_CEL}))",
            "message": f"spec.roles.*.tolerations: tolerating the control plane's taints ({', '.join(CONTROL_PLANE_TAINTS)}, or every taint "
                       f"with an empty key) is refused; the cluster admin may allow it with the chart value {VALUE_CONTROL_PLANE}",
            "reason": "Forbidden",
        },
        {
            "expression": f"!has({_SPEC}.serviceAccountName) || {_IN_NAMESPACE.format(resource='pods')}.check('create').allowed()",
            "messageExpression": "'spec.serviceAccountName: ' + request.userInfo.username + ' may not create pods in namespace ' + "
                                 "request.namespace + ', and the job would run pods as ServiceAccount ' + object.spec.serviceAccountName + "
                                 "': leave it out (the operator gives the pods a ServiceAccount of their own), or ask for create on pods'",
            "reason": "Forbidden",
        },
        {
            "expression": f"size(variables.secretNames) <= {MAX_CHECKED_SECRET_REFERENCES} || variables.mayGetEverySecret",
            "messageExpression": f"'the RLJob makes ' + string(size(variables.secretNames)) + ' Secret references; the admission policy checks "
                                 f"at most {MAX_CHECKED_SECRET_REFERENCES} one by one (the CEL cost budget of the API server), more only for a user "
                                 "who may get every Secret of the namespace'",
            "reason": "Forbidden",
        },
        *(_secret_slot(i) for i in range(MAX_CHECKED_SECRET_REFERENCES)),
    ]
    return {
        "defaults": {"volumeSources": list(DEFAULT_VOLUME_SOURCES)},
        "matchConstraints": {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                                                "resources": [PLURAL]}]},
        "matchConditions": [{"name": "grants-change", "expression": _changed_cel()}],
        "variables": [
            {"name": "roles", "expression": _roles_cel()},
            {"name": "secretNames", "expression": _secret_names_cel()},
            # Evaluated once, and only when a Secret is named: a user who may get them all needs no check per name.
            {"name": "mayGetEverySecret", "expression": f"{_IN_NAMESPACE.format(resource='secrets')}.check('get').allowed()"},
        ],
        "validations": validations,
    }


def policy_json() -> str:
    return json.dumps(policy(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(policy_json())

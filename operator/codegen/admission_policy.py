"""The chart's ValidatingAdmissionPolicy: admission.py's rules as CEL, and what only the API server can check.

The chart's template (helm/kuberl/templates/admission-policy.yaml) reads this rendering from
helm/kuberl/files/admission-policy.json and puts the allow-lists of its `admission` values in front of it
(CHART_VARIABLES). A test evaluates these expressions with cel-python against admission_problems.

Regenerate the chart's copy after changing this file or admission.py:
    .venv/bin/python -m kuberl.operator.codegen.admission_policy > helm/kuberl/files/admission-policy.json

Cost: an authorizer check costs 350000 of the API server's CEL budget, whose limits are 10^6 per expression
and 10^7 per request; so each expression makes at most one, and a Secret is checked once.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..validation.admission import (
    CONTROL_PLANE_TAINTS,
    DEFAULT_VOLUME_SOURCES,
    GRANTING_FIELDS,
    MAX_CHECKED_SECRET_REFERENCES,
    PROFILE_ANNOTATION_KEYS,
    PROFILE_ANNOTATION_PREFIXES,
    UNCONFINED,
    VALUE_CONTROL_PLANE,
    VALUE_RUNTIME_CLASSES,
    VALUE_SANDBOX_DNS,
    VALUE_SANDBOX_EGRESS,
    VALUE_VOLUME_SOURCES,
)
from ..api import GROUP, PLURAL


_ROLES = ("actor", "critic", "ref", "reward")
"""The roles whose pods carry all of PodGroupSpec; roles.rollout has its placement fields only (_ROLLOUT)."""
_SPEC = "object.spec"
_ROLLOUT = f"{_SPEC}.roles.rollout"
_IN_NAMESPACE = "authorizer.group('').resource('{resource}').namespace(request.namespace)"
# Variables the chart's template defines from its values (helm/kuberl/templates/admission-policy.yaml).
CHART_VARIABLES = (
    "allowedVolumeSources",
    "allowedRuntimeClasses",
    "allowControlPlaneTolerations",
    "allowedSandboxEgress",
    "allowSandboxDNS",
)


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _names(items: str, guard: str, name: str) -> str:
    """CEL: the list of `name` of each element of the list `items` (maybe absent) that has it."""
    return f"({items}.filter(x, {guard}).map(x, {name}))"


def _optional(path: str, list_expr: str) -> str:
    """CEL: `list_expr` when every step of `path` (object.spec.a.b) is there, else []."""
    parts = path.split(".")
    guards = [f"has({'.'.join(parts[: i + 1])})" for i in range(2, len(parts))]
    return f"({' && '.join(guards)} ? {list_expr} : [])"


def _secret_names_cel() -> str:
    vols = f"{_SPEC}.volumes"
    per_volume = " + ".join(
        [
            "(has(v.secret) && has(v.secret.secretName) ? [v.secret.secretName] : [])",
            "(has(v.azureFile) ? [v.azureFile.secretName] : [])",
            "(has(v.csi) && has(v.csi.nodePublishSecretRef) && has(v.csi.nodePublishSecretRef.name) ? [v.csi.nodePublishSecretRef.name] : [])",
            # The source (cephfs, rbd, iscsi, flexVolume, scaleIO, storageos) whose driver reads a Secret.
            "v.filter(k, k != 'name' && 'secretRef' in v[k] && 'name' in v[k].secretRef).map(k, v[k].secretRef.name)",
            "(has(v.projected) && has(v.projected.sources) ? v.projected.sources.filter(p, has(p.secret) && has(p.secret.name))"
            ".map(p, p.secret.name) : [])",
        ]
    )
    # CEL before Kubernetes 1.34 cannot flatten a list of lists; names never hold a comma, so join and split do.
    parts = [_optional(vols, f"{vols}.map(v, ({per_volume}).join(',')).join(',').split(',').filter(n, n != '')")]
    env_ref = _names(
        "{}", "has(x.valueFrom) && has(x.valueFrom.secretKeyRef) && has(x.valueFrom.secretKeyRef.name)", "x.valueFrom.secretKeyRef.name"
    )
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
    changed = [
        f"has(object.spec.{f}) != has(oldObject.spec.{f}) || (has(object.spec.{f}) && object.spec.{f} != oldObject.spec.{f})"
        for f in GRANTING_FIELDS
    ]
    return "request.operation == 'CREATE' || " + " || ".join(f"({c})" for c in changed)


_UNCONFINING_CEL = "r.pods.annotations[k] == '{u}' && ({keys} || {prefixes})".format(
    u=UNCONFINED,
    keys=" || ".join(f"k == '{k}'" for k in PROFILE_ANNOTATION_KEYS),
    prefixes=" || ".join(f"k.startsWith('{p}')" for p in PROFILE_ANNOTATION_PREFIXES),
)
_SANDBOX = f"{_SPEC}.rollout.multiTurn.sandbox"
_SANDBOX_HAS = " && ".join(f"has({_SANDBOX.rsplit('.', n)[0]})" for n in (2, 1, 0))
_SANDBOX_GUARD = f"!({_SANDBOX_HAS} && has({_SANDBOX}.runtimeClassName))"
# An empty key is refused by the schema already; judged here as what it would mean, every taint.
_CONTROL_PLANE_CEL = f"!has(t.key) || t.key == '' || t.key in {_cel_list(CONTROL_PLANE_TAINTS)}"


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
            # The tool sandbox pods' RuntimeClass (a gVisor or Kata class, typically), under the same allow-list.
            "expression": f"{_SANDBOX_GUARD} || {_SANDBOX}.runtimeClassName in variables.allowedRuntimeClasses",
            "messageExpression": f"'spec.rollout.multiTurn.sandbox.runtimeClassName: ' + {_SANDBOX}.runtimeClassName + ' is not an allowed "
            "RuntimeClass (allowed: ' + (size(variables.allowedRuntimeClasses) == 0 ? 'none' : "
            f"variables.allowedRuntimeClasses.join(', ')) + '); the cluster admin may add it to the chart value "
            f"{VALUE_RUNTIME_CLASSES}'",
            "reason": "Forbidden",
        },
        {
            # The networks a job opens to its sandbox pods, as written, under the chart's list.
            "expression": f"!({_SANDBOX_HAS} && has({_SANDBOX}.egress)) || {_SANDBOX}.egress.all(e, e.cidr in variables.allowedSandboxEgress)",
            "messageExpression": f"'spec.rollout.multiTurn.sandbox.egress: ' + {_SANDBOX}.egress.filter(e, !(e.cidr in "
            "variables.allowedSandboxEgress)).map(e, e.cidr).join(', ') + ' not a network the sandbox pods may reach "
            "(allowed: ' + (size(variables.allowedSandboxEgress) == 0 ? 'none' : variables.allowedSandboxEgress.join(', ')) "
            f"+ '); the cluster admin may add it to the chart value {VALUE_SANDBOX_EGRESS}'",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.allowSandboxDNS || !({_SANDBOX_HAS} && has({_SANDBOX}.dns) && {_SANDBOX}.dns)",
            "message": "spec.rollout.multiTurn.sandbox.dns: the sandbox pods may not ask the cluster's DNS here; the cluster admin may "
            f"allow it with the chart value {VALUE_SANDBOX_DNS}",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.roles.all(r, !has(r.pods.annotations) || !r.pods.annotations.exists(k, {_UNCONFINING_CEL}))",
            "message": "spec.roles.*.annotations: an unconfined AppArmor or seccomp profile is refused; kuberl's pods always run under "
            "the runtime's default profiles",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.allowControlPlaneTolerations || (variables.roles.all(r, !has(r.pods.tolerations) || "
            f"!r.pods.tolerations.exists(t, {_CONTROL_PLANE_CEL})) && (!has({_ROLLOUT}) || !has({_ROLLOUT}.tolerations) || "
            f"!{_ROLLOUT}.tolerations.exists(t, {_CONTROL_PLANE_CEL})))",
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
        "matchConstraints": {
            "resourceRules": [{"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": [PLURAL]}]
        },
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

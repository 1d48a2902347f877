"""Kubernetes types the RLJob embeds, generated from the kubernetes client 37.0.2's models.

Do not edit: run `.venv/bin/python -m kuberl.operator.kube_types_codegen > operator/api/kube_types.py`
(see kuberl.operator.kube_types_codegen for how and why).
"""

from typing import Annotated, Any, Literal

from pydantic import Field

from kuberl.engine.config import SpecModel

from .kube_grammar import LabelKey, SelectorLabels


class NodeSelectorRequirement(SpecModel):
    """A node selector requirement is a selector that contains values, a key, and an operator that relates the key and values."""

    key: LabelKey = Field(alias='key')
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(alias='operator')
    values: list[str] | None = Field(default=None, alias='values')


class NodeSelectorTerm(SpecModel):
    """A null or empty node selector term matches no objects."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(default=None, alias='matchExpressions')
    match_fields: list[NodeSelectorRequirement] | None = Field(default=None, alias='matchFields')


class NodeSelector(SpecModel):
    """A node selector represents the union of the results of one or more label queries over a set of nodes; that is, it represents the OR of the selectors represented by the node selector terms."""

    node_selector_terms: list[NodeSelectorTerm] = Field(alias='nodeSelectorTerms')


class PreferredSchedulingTerm(SpecModel):
    """An empty preferred scheduling term matches all objects with implicit weight 0 (i.e."""

    preference: NodeSelectorTerm = Field(alias='preference')
    weight: Annotated[int, Field(ge=1, le=100)] = Field(alias='weight')


class NodeAffinity(SpecModel):
    """Node affinity is a group of node affinity scheduling rules."""

    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(default=None, alias='preferredDuringSchedulingIgnoredDuringExecution')
    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(default=None, alias='requiredDuringSchedulingIgnoredDuringExecution')


class LabelSelectorRequirement(SpecModel):
    """A label selector requirement is a selector that contains values, a key, and an operator that relates the key and values."""

    key: LabelKey = Field(alias='key')
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(alias='operator')
    values: list[str] | None = Field(default=None, alias='values')


class LabelSelector(SpecModel):
    """A label selector is a label query over a set of resources."""

    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, alias='matchExpressions')
    match_labels: SelectorLabels | None = Field(default=None, alias='matchLabels')


class PodAffinityTerm(SpecModel):
    """Defines a set of pods (namely those matching the labelSelector relative to the given namespace(s)) that this pod should be co-located (affinity) or not co-located (anti-affinity) with, where co-located is defined as running on a node whose value of the label with key <topologyKey> matches that of any node on which a pod of the set of pods is running"""

    label_selector: LabelSelector | None = Field(default=None, alias='labelSelector')
    match_label_keys: list[str] | None = Field(default=None, alias='matchLabelKeys')
    mismatch_label_keys: list[str] | None = Field(default=None, alias='mismatchLabelKeys')
    namespace_selector: LabelSelector | None = Field(default=None, alias='namespaceSelector')
    namespaces: list[str] | None = Field(default=None, alias='namespaces')
    topology_key: LabelKey = Field(alias='topologyKey')


class WeightedPodAffinityTerm(SpecModel):
    """The weights of all of the matched WeightedPodAffinityTerm fields are added per-node to find the most preferred node(s)"""

    pod_affinity_term: PodAffinityTerm = Field(alias='podAffinityTerm')
    weight: Annotated[int, Field(ge=1, le=100)] = Field(alias='weight')


class PodAffinity(SpecModel):
    """Pod affinity is a group of inter pod affinity scheduling rules."""

    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(default=None, alias='preferredDuringSchedulingIgnoredDuringExecution')
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(default=None, alias='requiredDuringSchedulingIgnoredDuringExecution')


class PodAntiAffinity(SpecModel):
    """Pod anti affinity is a group of inter pod anti affinity scheduling rules."""

    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(default=None, alias='preferredDuringSchedulingIgnoredDuringExecution')
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(default=None, alias='requiredDuringSchedulingIgnoredDuringExecution')


class Affinity(SpecModel):
    """Affinity is a group of affinity scheduling rules."""

    node_affinity: NodeAffinity | None = Field(default=None, alias='nodeAffinity')
    pod_affinity: PodAffinity | None = Field(default=None, alias='podAffinity')
    pod_anti_affinity: PodAntiAffinity | None = Field(default=None, alias='podAntiAffinity')


class ManagedFieldsEntry(SpecModel):
    """ManagedFieldsEntry is a workflow-id, a FieldSet and the group version of the resource that the fieldset applies to."""

    api_version: str | None = Field(default=None, alias='apiVersion')
    fields_type: str | None = Field(default=None, alias='fieldsType')
    fields_v1: dict[str, Any] | None = Field(default=None, alias='fieldsV1')
    manager: str | None = Field(default=None, alias='manager')
    operation: str | None = Field(default=None, alias='operation')
    subresource: str | None = Field(default=None, alias='subresource')
    time: str | None = Field(default=None, alias='time')


class OwnerReference(SpecModel):
    """OwnerReference contains enough information to let you identify an owning object."""

    api_version: str = Field(alias='apiVersion')
    block_owner_deletion: bool | None = Field(default=None, alias='blockOwnerDeletion')
    controller: bool | None = Field(default=None, alias='controller')
    kind: str = Field(alias='kind')
    name: str = Field(alias='name')
    uid: str = Field(alias='uid')


class ObjectMeta(SpecModel):
    """ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create."""

    annotations: dict[str, str] | None = Field(default=None, alias='annotations')
    creation_timestamp: str | None = Field(default=None, alias='creationTimestamp')
    deletion_grace_period_seconds: int | None = Field(default=None, alias='deletionGracePeriodSeconds')
    deletion_timestamp: str | None = Field(default=None, alias='deletionTimestamp')
    finalizers: list[str] | None = Field(default=None, alias='finalizers')
    generate_name: str | None = Field(default=None, alias='generateName')
    generation: int | None = Field(default=None, alias='generation')
    labels: dict[str, str] | None = Field(default=None, alias='labels')
    managed_fields: list[ManagedFieldsEntry] | None = Field(default=None, alias='managedFields')
    name: str | None = Field(default=None, alias='name')
    namespace: str | None = Field(default=None, alias='namespace')
    owner_references: list[OwnerReference] | None = Field(default=None, alias='ownerReferences')
    resource_version: str | None = Field(default=None, alias='resourceVersion')
    self_link: str | None = Field(default=None, alias='selfLink')
    uid: str | None = Field(default=None, alias='uid')

"""Kubernetes types the RLJob embeds, generated from the kubernetes client 37.0.2's models.

Do not edit: run `.venv/bin/python -m kuberl.operator.codegen.kube_types > operator/api/kube_types.py`
(see kuberl.operator.codegen.kube_types for how and why).
"""

from typing import Annotated, Any, Literal

from pydantic import Field

from kuberl.engine.config import SpecModel

from .kube_grammar import DNSLabel, EnvVarName, LabelKey, MountPath, Quantity, SelectorLabels


class AWSElasticBlockStoreVolumeSource(SpecModel):
    """Represents a Persistent Disk resource in AWS."""

    fs_type: str | None = Field(default=None, alias='fsType')
    partition: int | None = Field(default=None, alias='partition')
    read_only: bool | None = Field(default=None, alias='readOnly')
    volume_id: str = Field(alias='volumeID')


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


class AzureDiskVolumeSource(SpecModel):
    """AzureDisk represents an Azure Data Disk mount on the host and bind mount to the pod."""

    caching_mode: str | None = Field(default=None, alias='cachingMode')
    disk_name: str = Field(alias='diskName')
    disk_uri: str = Field(alias='diskURI')
    fs_type: str | None = Field(default=None, alias='fsType')
    kind: str | None = Field(default=None, alias='kind')
    read_only: bool | None = Field(default=None, alias='readOnly')


class AzureFileVolumeSource(SpecModel):
    """AzureFile represents an Azure File Service mount on the host and bind mount to the pod."""

    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_name: str = Field(alias='secretName')
    share_name: str = Field(alias='shareName')


class LocalObjectReference(SpecModel):
    """LocalObjectReference contains enough information to let you locate the referenced object inside the same namespace."""

    name: str | None = Field(default=None, alias='name')


class CSIVolumeSource(SpecModel):
    """Represents a source location of a volume to mount, managed by an external CSI driver"""

    driver: str = Field(alias='driver')
    fs_type: str | None = Field(default=None, alias='fsType')
    node_publish_secret_ref: LocalObjectReference | None = Field(default=None, alias='nodePublishSecretRef')
    read_only: bool | None = Field(default=None, alias='readOnly')
    volume_attributes: dict[str, str] | None = Field(default=None, alias='volumeAttributes')


class CephFSVolumeSource(SpecModel):
    """Represents a Ceph Filesystem mount that lasts the lifetime of a pod Cephfs volumes do not support ownership management or SELinux relabeling."""

    monitors: list[str] = Field(alias='monitors')
    path: str | None = Field(default=None, alias='path')
    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_file: str | None = Field(default=None, alias='secretFile')
    secret_ref: LocalObjectReference | None = Field(default=None, alias='secretRef')
    user: str | None = Field(default=None, alias='user')


class CinderVolumeSource(SpecModel):
    """Represents a cinder volume resource in Openstack."""

    fs_type: str | None = Field(default=None, alias='fsType')
    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_ref: LocalObjectReference | None = Field(default=None, alias='secretRef')
    volume_id: str = Field(alias='volumeID')


class ClusterTrustBundleProjection(SpecModel):
    """ClusterTrustBundleProjection describes how to select a set of ClusterTrustBundle objects and project their contents into the pod filesystem."""

    label_selector: LabelSelector | None = Field(default=None, alias='labelSelector')
    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')
    path: str = Field(alias='path')
    signer_name: str | None = Field(default=None, alias='signerName')
    user: int | None = Field(default=None, alias='user')


class ConfigMapEnvSource(SpecModel):
    """ConfigMapEnvSource selects a ConfigMap to populate the environment variables with."""

    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')


class ConfigMapKeySelector(SpecModel):
    """Selects a key from a ConfigMap."""

    key: str = Field(alias='key')
    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')


class KeyToPath(SpecModel):
    """Maps a string key to a path within a volume."""

    key: str = Field(alias='key')
    mode: int | None = Field(default=None, alias='mode')
    path: str = Field(alias='path')
    user: int | None = Field(default=None, alias='user')


class ConfigMapProjection(SpecModel):
    """Adapts a ConfigMap into a projected volume."""

    items: list[KeyToPath] | None = Field(default=None, alias='items')
    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')


class ConfigMapVolumeSource(SpecModel):
    """Adapts a ConfigMap into a volume."""

    default_mode: int | None = Field(default=None, alias='defaultMode')
    default_user: int | None = Field(default=None, alias='defaultUser')
    items: list[KeyToPath] | None = Field(default=None, alias='items')
    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')


class ObjectFieldSelector(SpecModel):
    """ObjectFieldSelector selects an APIVersioned field of an object."""

    api_version: str | None = Field(default=None, alias='apiVersion')
    field_path: str = Field(alias='fieldPath')


class ResourceFieldSelector(SpecModel):
    """ResourceFieldSelector represents container resources (cpu, memory) and their output format"""

    container_name: str | None = Field(default=None, alias='containerName')
    divisor: Quantity | None = Field(default=None, alias='divisor')
    resource: str = Field(alias='resource')


class DownwardAPIVolumeFile(SpecModel):
    """DownwardAPIVolumeFile represents information to create the file containing the pod field"""

    field_ref: ObjectFieldSelector | None = Field(default=None, alias='fieldRef')
    mode: int | None = Field(default=None, alias='mode')
    path: str = Field(alias='path')
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, alias='resourceFieldRef')
    user: int | None = Field(default=None, alias='user')


class DownwardAPIProjection(SpecModel):
    """Represents downward API info for projecting into a projected volume."""

    items: list[DownwardAPIVolumeFile] | None = Field(default=None, alias='items')


class DownwardAPIVolumeSource(SpecModel):
    """DownwardAPIVolumeSource represents a volume containing downward API info."""

    default_mode: int | None = Field(default=None, alias='defaultMode')
    default_user: int | None = Field(default=None, alias='defaultUser')
    items: list[DownwardAPIVolumeFile] | None = Field(default=None, alias='items')


class EmptyDirVolumeSource(SpecModel):
    """Represents an empty directory for a pod."""

    medium: str | None = Field(default=None, alias='medium')
    mode: int | None = Field(default=None, alias='mode')
    size_limit: Quantity | None = Field(default=None, alias='sizeLimit')


class SecretEnvSource(SpecModel):
    """SecretEnvSource selects a Secret to populate the environment variables with."""

    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')


class EnvFromSource(SpecModel):
    """EnvFromSource represents the source of a set of ConfigMaps or Secrets"""

    config_map_ref: ConfigMapEnvSource | None = Field(default=None, alias='configMapRef')
    prefix: str | None = Field(default=None, alias='prefix')
    secret_ref: SecretEnvSource | None = Field(default=None, alias='secretRef')


class FileKeySelector(SpecModel):
    """FileKeySelector selects a key of the env file."""

    key: str = Field(alias='key')
    optional: bool | None = Field(default=None, alias='optional')
    path: str = Field(alias='path')
    volume_name: str = Field(alias='volumeName')


class SecretKeySelector(SpecModel):
    """SecretKeySelector selects a key of a Secret."""

    key: str = Field(alias='key')
    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')


class EnvVarSource(SpecModel):
    """EnvVarSource represents a source for the value of an EnvVar."""

    config_map_key_ref: ConfigMapKeySelector | None = Field(default=None, alias='configMapKeyRef')
    field_ref: ObjectFieldSelector | None = Field(default=None, alias='fieldRef')
    file_key_ref: FileKeySelector | None = Field(default=None, alias='fileKeyRef')
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, alias='resourceFieldRef')
    secret_key_ref: SecretKeySelector | None = Field(default=None, alias='secretKeyRef')


class EnvVar(SpecModel):
    """EnvVar represents an environment variable present in a Container."""

    name: EnvVarName = Field(alias='name')
    value: str | None = Field(default=None, alias='value')
    value_from: EnvVarSource | None = Field(default=None, alias='valueFrom')


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


class TypedLocalObjectReference(SpecModel):
    """TypedLocalObjectReference contains enough information to let you locate the typed referenced object inside the same namespace."""

    api_group: str | None = Field(default=None, alias='apiGroup')
    kind: str = Field(alias='kind')
    name: str = Field(alias='name')


class TypedObjectReference(SpecModel):
    """TypedObjectReference contains enough information to let you locate the typed referenced object"""

    api_group: str | None = Field(default=None, alias='apiGroup')
    kind: str = Field(alias='kind')
    name: str = Field(alias='name')
    namespace: str | None = Field(default=None, alias='namespace')


class VolumeResourceRequirements(SpecModel):
    """VolumeResourceRequirements describes the storage resource requirements for a volume."""

    limits: dict[str, Quantity] | None = Field(default=None, alias='limits')
    requests: dict[str, Quantity] | None = Field(default=None, alias='requests')


class PersistentVolumeClaimSpec(SpecModel):
    """PersistentVolumeClaimSpec describes the common attributes of storage devices and allows a Source for provider-specific attributes"""

    access_modes: list[str] | None = Field(default=None, alias='accessModes')
    data_source: TypedLocalObjectReference | None = Field(default=None, alias='dataSource')
    data_source_ref: TypedObjectReference | None = Field(default=None, alias='dataSourceRef')
    resources: VolumeResourceRequirements | None = Field(default=None, alias='resources')
    selector: LabelSelector | None = Field(default=None, alias='selector')
    storage_class_name: str | None = Field(default=None, alias='storageClassName')
    volume_attributes_class_name: str | None = Field(default=None, alias='volumeAttributesClassName')
    volume_mode: str | None = Field(default=None, alias='volumeMode')
    volume_name: str | None = Field(default=None, alias='volumeName')


class PersistentVolumeClaimTemplate(SpecModel):
    """PersistentVolumeClaimTemplate is used to produce PersistentVolumeClaim objects as part of an EphemeralVolumeSource."""

    metadata: ObjectMeta | None = Field(default=None, alias='metadata')
    spec: PersistentVolumeClaimSpec = Field(alias='spec')


class EphemeralVolumeSource(SpecModel):
    """Represents an ephemeral volume that is handled by a normal storage driver."""

    volume_claim_template: PersistentVolumeClaimTemplate | None = Field(default=None, alias='volumeClaimTemplate')


class FCVolumeSource(SpecModel):
    """Represents a Fibre Channel volume."""

    fs_type: str | None = Field(default=None, alias='fsType')
    lun: int | None = Field(default=None, alias='lun')
    read_only: bool | None = Field(default=None, alias='readOnly')
    target_wwns: list[str] | None = Field(default=None, alias='targetWWNs')
    wwids: list[str] | None = Field(default=None, alias='wwids')


class FlexVolumeSource(SpecModel):
    """FlexVolume represents a generic volume resource that is provisioned/attached using an exec based plugin."""

    driver: str = Field(alias='driver')
    fs_type: str | None = Field(default=None, alias='fsType')
    options: dict[str, str] | None = Field(default=None, alias='options')
    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_ref: LocalObjectReference | None = Field(default=None, alias='secretRef')


class FlockerVolumeSource(SpecModel):
    """Represents a Flocker volume mounted by the Flocker agent."""

    dataset_name: str | None = Field(default=None, alias='datasetName')
    dataset_uuid: str | None = Field(default=None, alias='datasetUUID')


class GCEPersistentDiskVolumeSource(SpecModel):
    """Represents a Persistent Disk resource in Google Compute Engine."""

    fs_type: str | None = Field(default=None, alias='fsType')
    partition: int | None = Field(default=None, alias='partition')
    pd_name: str = Field(alias='pdName')
    read_only: bool | None = Field(default=None, alias='readOnly')


class GitRepoVolumeSource(SpecModel):
    """Represents a volume that is populated with the contents of a git repository."""

    directory: str | None = Field(default=None, alias='directory')
    repository: str = Field(alias='repository')
    revision: str | None = Field(default=None, alias='revision')


class GlusterfsVolumeSource(SpecModel):
    """Represents a Glusterfs mount that lasts the lifetime of a pod."""

    endpoints: str = Field(alias='endpoints')
    path: str = Field(alias='path')
    read_only: bool | None = Field(default=None, alias='readOnly')


class HostPathVolumeSource(SpecModel):
    """Represents a host path mapped into a pod."""

    path: str = Field(alias='path')
    type: str | None = Field(default=None, alias='type')


class ISCSIVolumeSource(SpecModel):
    """Represents an ISCSI disk."""

    chap_auth_discovery: bool | None = Field(default=None, alias='chapAuthDiscovery')
    chap_auth_session: bool | None = Field(default=None, alias='chapAuthSession')
    fs_type: str | None = Field(default=None, alias='fsType')
    initiator_name: str | None = Field(default=None, alias='initiatorName')
    iqn: str = Field(alias='iqn')
    iscsi_interface: str | None = Field(default=None, alias='iscsiInterface')
    lun: int = Field(alias='lun')
    portals: list[str] | None = Field(default=None, alias='portals')
    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_ref: LocalObjectReference | None = Field(default=None, alias='secretRef')
    target_portal: str = Field(alias='targetPortal')


class ImageVolumeSource(SpecModel):
    """ImageVolumeSource represents a image volume resource."""

    pull_policy: str | None = Field(default=None, alias='pullPolicy')
    reference: str | None = Field(default=None, alias='reference')


class NFSVolumeSource(SpecModel):
    """Represents an NFS mount that lasts the lifetime of a pod."""

    path: str = Field(alias='path')
    read_only: bool | None = Field(default=None, alias='readOnly')
    server: str = Field(alias='server')


class PersistentVolumeClaimVolumeSource(SpecModel):
    """PersistentVolumeClaimVolumeSource references the user's PVC in the same namespace."""

    claim_name: str = Field(alias='claimName')
    read_only: bool | None = Field(default=None, alias='readOnly')


class PhotonPersistentDiskVolumeSource(SpecModel):
    """Represents a Photon Controller persistent disk resource."""

    fs_type: str | None = Field(default=None, alias='fsType')
    pd_id: str = Field(alias='pdID')


class PodCertificateProjection(SpecModel):
    """PodCertificateProjection provides a private key and X.509 certificate in the pod filesystem."""

    certificate_chain_path: str | None = Field(default=None, alias='certificateChainPath')
    credential_bundle_path: str | None = Field(default=None, alias='credentialBundlePath')
    key_path: str | None = Field(default=None, alias='keyPath')
    key_type: str = Field(alias='keyType')
    max_expiration_seconds: int | None = Field(default=None, alias='maxExpirationSeconds')
    signer_name: str = Field(alias='signerName')
    user: int | None = Field(default=None, alias='user')
    user_annotations: dict[str, str] | None = Field(default=None, alias='userAnnotations')


class PortworxVolumeSource(SpecModel):
    """PortworxVolumeSource represents a Portworx volume resource."""

    fs_type: str | None = Field(default=None, alias='fsType')
    read_only: bool | None = Field(default=None, alias='readOnly')
    volume_id: str = Field(alias='volumeID')


class SecretProjection(SpecModel):
    """Adapts a secret into a projected volume."""

    items: list[KeyToPath] | None = Field(default=None, alias='items')
    name: str | None = Field(default=None, alias='name')
    optional: bool | None = Field(default=None, alias='optional')


class ServiceAccountTokenProjection(SpecModel):
    """ServiceAccountTokenProjection represents a projected service account token volume."""

    audience: str | None = Field(default=None, alias='audience')
    expiration_seconds: int | None = Field(default=None, alias='expirationSeconds')
    path: str = Field(alias='path')
    user: int | None = Field(default=None, alias='user')


class VolumeProjection(SpecModel):
    """Projection that may be projected along with other supported volume types."""

    cluster_trust_bundle: ClusterTrustBundleProjection | None = Field(default=None, alias='clusterTrustBundle')
    config_map: ConfigMapProjection | None = Field(default=None, alias='configMap')
    downward_api: DownwardAPIProjection | None = Field(default=None, alias='downwardAPI')
    pod_certificate: PodCertificateProjection | None = Field(default=None, alias='podCertificate')
    secret: SecretProjection | None = Field(default=None, alias='secret')
    service_account_token: ServiceAccountTokenProjection | None = Field(default=None, alias='serviceAccountToken')


class ProjectedVolumeSource(SpecModel):
    """Represents a projected volume source"""

    default_mode: int | None = Field(default=None, alias='defaultMode')
    default_user: int | None = Field(default=None, alias='defaultUser')
    sources: list[VolumeProjection] | None = Field(default=None, alias='sources')


class QuobyteVolumeSource(SpecModel):
    """Represents a Quobyte mount that lasts the lifetime of a pod."""

    group: str | None = Field(default=None, alias='group')
    read_only: bool | None = Field(default=None, alias='readOnly')
    registry: str = Field(alias='registry')
    tenant: str | None = Field(default=None, alias='tenant')
    user: str | None = Field(default=None, alias='user')
    volume: str = Field(alias='volume')


class RBDVolumeSource(SpecModel):
    """Represents a Rados Block Device mount that lasts the lifetime of a pod."""

    fs_type: str | None = Field(default=None, alias='fsType')
    image: str = Field(alias='image')
    keyring: str | None = Field(default=None, alias='keyring')
    monitors: list[str] = Field(alias='monitors')
    pool: str | None = Field(default=None, alias='pool')
    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_ref: LocalObjectReference | None = Field(default=None, alias='secretRef')
    user: str | None = Field(default=None, alias='user')


class ScaleIOVolumeSource(SpecModel):
    """ScaleIOVolumeSource represents a persistent ScaleIO volume"""

    fs_type: str | None = Field(default=None, alias='fsType')
    gateway: str = Field(alias='gateway')
    protection_domain: str | None = Field(default=None, alias='protectionDomain')
    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_ref: LocalObjectReference = Field(alias='secretRef')
    ssl_enabled: bool | None = Field(default=None, alias='sslEnabled')
    storage_mode: str | None = Field(default=None, alias='storageMode')
    storage_pool: str | None = Field(default=None, alias='storagePool')
    system: str = Field(alias='system')
    volume_name: str | None = Field(default=None, alias='volumeName')


class SecretVolumeSource(SpecModel):
    """Adapts a Secret into a volume."""

    default_mode: int | None = Field(default=None, alias='defaultMode')
    default_user: int | None = Field(default=None, alias='defaultUser')
    items: list[KeyToPath] | None = Field(default=None, alias='items')
    optional: bool | None = Field(default=None, alias='optional')
    secret_name: str | None = Field(default=None, alias='secretName')


class StorageOSVolumeSource(SpecModel):
    """Represents a StorageOS persistent volume resource."""

    fs_type: str | None = Field(default=None, alias='fsType')
    read_only: bool | None = Field(default=None, alias='readOnly')
    secret_ref: LocalObjectReference | None = Field(default=None, alias='secretRef')
    volume_name: str | None = Field(default=None, alias='volumeName')
    volume_namespace: str | None = Field(default=None, alias='volumeNamespace')


class VsphereVirtualDiskVolumeSource(SpecModel):
    """Represents a vSphere volume resource."""

    fs_type: str | None = Field(default=None, alias='fsType')
    storage_policy_id: str | None = Field(default=None, alias='storagePolicyID')
    storage_policy_name: str | None = Field(default=None, alias='storagePolicyName')
    volume_path: str = Field(alias='volumePath')


class Volume(SpecModel):
    """Volume represents a named volume in a pod that may be accessed by any container in the pod."""

    aws_elastic_block_store: AWSElasticBlockStoreVolumeSource | None = Field(default=None, alias='awsElasticBlockStore')
    azure_disk: AzureDiskVolumeSource | None = Field(default=None, alias='azureDisk')
    azure_file: AzureFileVolumeSource | None = Field(default=None, alias='azureFile')
    cephfs: CephFSVolumeSource | None = Field(default=None, alias='cephfs')
    cinder: CinderVolumeSource | None = Field(default=None, alias='cinder')
    config_map: ConfigMapVolumeSource | None = Field(default=None, alias='configMap')
    csi: CSIVolumeSource | None = Field(default=None, alias='csi')
    downward_api: DownwardAPIVolumeSource | None = Field(default=None, alias='downwardAPI')
    empty_dir: EmptyDirVolumeSource | None = Field(default=None, alias='emptyDir')
    ephemeral: EphemeralVolumeSource | None = Field(default=None, alias='ephemeral')
    fc: FCVolumeSource | None = Field(default=None, alias='fc')
    flex_volume: FlexVolumeSource | None = Field(default=None, alias='flexVolume')
    flocker: FlockerVolumeSource | None = Field(default=None, alias='flocker')
    gce_persistent_disk: GCEPersistentDiskVolumeSource | None = Field(default=None, alias='gcePersistentDisk')
    git_repo: GitRepoVolumeSource | None = Field(default=None, alias='gitRepo')
    glusterfs: GlusterfsVolumeSource | None = Field(default=None, alias='glusterfs')
    host_path: HostPathVolumeSource | None = Field(default=None, alias='hostPath')
    image: ImageVolumeSource | None = Field(default=None, alias='image')
    iscsi: ISCSIVolumeSource | None = Field(default=None, alias='iscsi')
    name: DNSLabel = Field(alias='name')
    nfs: NFSVolumeSource | None = Field(default=None, alias='nfs')
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = Field(default=None, alias='persistentVolumeClaim')
    photon_persistent_disk: PhotonPersistentDiskVolumeSource | None = Field(default=None, alias='photonPersistentDisk')
    portworx_volume: PortworxVolumeSource | None = Field(default=None, alias='portworxVolume')
    projected: ProjectedVolumeSource | None = Field(default=None, alias='projected')
    quobyte: QuobyteVolumeSource | None = Field(default=None, alias='quobyte')
    rbd: RBDVolumeSource | None = Field(default=None, alias='rbd')
    scale_io: ScaleIOVolumeSource | None = Field(default=None, alias='scaleIO')
    secret: SecretVolumeSource | None = Field(default=None, alias='secret')
    storageos: StorageOSVolumeSource | None = Field(default=None, alias='storageos')
    vsphere_volume: VsphereVirtualDiskVolumeSource | None = Field(default=None, alias='vsphereVolume')


class VolumeMount(SpecModel):
    """VolumeMount describes a mounting of a Volume within a container."""

    bind_mount_options: list[str] | None = Field(default=None, alias='bindMountOptions')
    mount_path: MountPath = Field(alias='mountPath')
    mount_propagation: str | None = Field(default=None, alias='mountPropagation')
    name: DNSLabel = Field(alias='name')
    read_only: bool | None = Field(default=None, alias='readOnly')
    recursive_read_only: str | None = Field(default=None, alias='recursiveReadOnly')
    sub_path: str | None = Field(default=None, alias='subPath')
    sub_path_expr: str | None = Field(default=None, alias='subPathExpr')

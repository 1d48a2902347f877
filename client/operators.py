"""Which kuberl operator a cluster runs, as `kuberl version` reports it: the chart's Deployment, found by its labels.

The operator serves no API of its own to ask, and its pods' image may be overridden (the chart's image.tag), so both
are shown: the chart's app.kubernetes.io/version label (the version the chart installs) and the image the Deployment runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The labels helm/kuberl/templates/deployment.yaml puts on the operator's Deployment.
OPERATOR_SELECTOR = "app.kubernetes.io/name=kuberl,app.kubernetes.io/component=operator"
VERSION_LABEL = "app.kubernetes.io/version"
CHART_NAMESPACE = "kuberl-system"
"""Where docs/install.md installs the chart: looked in when the user may not list Deployments in every namespace."""


@dataclass(frozen=True)
class OperatorDeployment:
    namespace: str
    name: str
    version: str | None
    """The chart's app.kubernetes.io/version label, else the image's tag; None when neither says."""
    image: str | None
    ready: int
    replicas: int

    @classmethod
    def of(cls, deployment: Any) -> OperatorDeployment:
        """From a V1Deployment."""
        meta, spec = deployment.metadata, deployment.spec
        containers = spec.template.spec.containers if spec and spec.template and spec.template.spec else []
        image = next((c.image for c in containers if c.name == "operator"), containers[0].image if containers else None)
        version = (meta.labels or {}).get(VERSION_LABEL) or image_tag(image)
        status = deployment.status
        return cls(
            meta.namespace,
            meta.name,
            version,
            image,
            (status and status.ready_replicas) or 0,
            spec.replicas if spec and spec.replicas is not None else 1,
        )

    def line(self) -> str:
        return (
            f"operator: {self.version or 'unknown'} (Deployment {self.namespace}/{self.name}, image {self.image or '-'}, "
            f"{self.ready}/{self.replicas} ready)"
        )


def image_tag(image: str | None) -> str | None:
    """registry:5000/kuberl-operator:0.1.0 -> 0.1.0; None for an untagged image or one named by digest only."""
    if not image:
        return None
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else None

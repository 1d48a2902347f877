"""The operator hands kopf the token the kubernetes client would send, however it was configured."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from kuberl.operator.control.manager import bearer_token


def test_in_cluster_token_is_read_through_the_loader_and_its_lower_case_prefix_dropped(tmp_path: Path) -> None:
    # What a pod has: the ServiceAccount's token and CA files, and the kubernetes Service's address.
    (tmp_path / "token").write_text("sa-token-1")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    configuration = client.Configuration()
    loader = InClusterConfigLoader(
        str(tmp_path / "token"),
        str(tmp_path / "ca.crt"),
        environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    )
    loader.load_and_set(configuration)
    assert bearer_token(configuration) == "sa-token-1"


def test_kubeconfig_and_split_prefix_forms() -> None:
    configuration = client.Configuration()
    configuration.api_key = {"authorization": "Bearer from-kubeconfig"}
    assert bearer_token(configuration) == "from-kubeconfig"
    configuration.api_key, configuration.api_key_prefix = {"authorization": "split"}, {"authorization": "Bearer"}
    assert bearer_token(configuration) == "split"
    assert bearer_token(client.Configuration()) is None

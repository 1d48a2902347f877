"""Experiment tracking backends (monitoring.tracking): TensorBoard, MLflow, Weights & Biases.

One flat record per backend, as the rest of the API is flat: each field applies to its backend
only, and a rule says so. Credentials are Secret references only; the pods get them as
environment variables from the Secret (the operator), `kuberl run` from its own environment.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import LocalPath, Rule, SpecModel, pattern
from .model import SecretKeyRef

TrackingBackendName = Literal["tensorboard", "mlflow", "wandb"]

# The environment variable each backend's library reads its credential from.
SECRET_ENV: dict[str, tuple[str, str]] = {
    "mlflow": ("token_secret_ref", "MLFLOW_TRACKING_TOKEN"),
    "wandb": ("api_key_secret_ref", "WANDB_API_KEY"),
}


def _only_for(attr: str, api_name: str, backend: str) -> Rule:
    return Rule(
        message=f"{api_name} applies only to backend: {backend}",
        check=lambda s: getattr(s, attr) is None or s.backend == backend,
        cel=f"!has(self.{api_name}) || self.backend == '{backend}'",
        field=api_name,
    )


def _required_for(attr: str, api_name: str, backend: str) -> Rule:
    return Rule(
        message=f"backend {backend} needs {api_name}",
        check=lambda s: s.backend != backend or getattr(s, attr) is not None,
        cel=f"self.backend != '{backend}' || has(self.{api_name})",
        field=api_name,
    )


class TrackingSpec(SpecModel):
    """One experiment tracker that receives every step's metrics, the job's config and its reward curve."""

    backend: TrackingBackendName
    """tensorboard (event files under path), mlflow (a tracking server or store) or wandb (Weights & Biases)."""
    path: LocalPath | None = None
    """tensorboard: the event files' folder (default: `tensorboard` in the run's folder, the
    checkpoint volume in a pod)."""
    tracking_uri: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        pattern=pattern(
            r"^(https?://[^\s]+|file:[^\s]+|databricks(://[^\s]*)?)$", "an MLflow tracking URI: http(s)://..., file:/path or databricks"
        ),
    )
    """mlflow: the tracking server (http(s)://...), a local store (file:/path) or databricks."""
    experiment: str | None = Field(default=None, min_length=1, max_length=256)
    """mlflow: the experiment's name (default: the RLJob's name)."""
    token_secret_ref: SecretKeyRef | None = None
    """mlflow: a Secret key holding the server's token (MLFLOW_TRACKING_TOKEN in the trainer pods)."""
    project: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=pattern(r"^[^/\\#?%:]+$", "a name without /, \\, #, ?, % or :")
    )
    """wandb: the project."""
    entity: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=pattern(r"^[^/\\#?%:]+$", "a name without /, \\, #, ?, % or :")
    )
    """wandb: the team or user (default: the API key's)."""
    mode: Literal["online", "offline"] | None = None
    """wandb: online (default) sends to W&B as it goes; offline writes the run's folder only (`wandb sync` uploads it)."""
    api_key_secret_ref: SecretKeyRef | None = None
    """wandb: a Secret key holding the API key (WANDB_API_KEY in the trainer pods)."""

    RULES = (
        _only_for("path", "path", "tensorboard"),
        _only_for("tracking_uri", "trackingUri", "mlflow"),
        _only_for("experiment", "experiment", "mlflow"),
        _only_for("token_secret_ref", "tokenSecretRef", "mlflow"),
        _only_for("project", "project", "wandb"),
        _only_for("entity", "entity", "wandb"),
        _only_for("mode", "mode", "wandb"),
        _only_for("api_key_secret_ref", "apiKeySecretRef", "wandb"),
        _required_for("tracking_uri", "trackingUri", "mlflow"),
        _required_for("project", "project", "wandb"),
    )

    @property
    def secret(self) -> tuple[SecretKeyRef, str] | None:
        """The backend's credential reference and the environment variable that carries it."""
        if self.backend not in SECRET_ENV:
            return None
        attr, env = SECRET_ENV[self.backend]
        ref = getattr(self, attr)
        return (ref, env) if ref is not None else None

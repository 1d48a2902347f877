"""Where a model's Hugging Face folder is, for each kind of source a job may name."""

from __future__ import annotations

import os
from pathlib import Path

from ..config.model import WeightsSource
from ..config.termination import NotRetryable
from .loading import gguf_to_hf_folder


class ModelNotFound(NotRetryable, FileNotFoundError):
    """The model a job names is not where it says; the message names the field."""

    reason = "ModelNotFound"


def model_folder(source: WeightsSource, base_dir: Path = Path("."), *, field: str = "model") -> Path:
    """A Hugging Face folder for `source`: the folder itself, a GGUF file converted once (cached), or a hub download.

    `field` is the spec field that names the source (model, tokenizer, reward.model), for the messages.
    """
    if source.path is not None:
        folder = _resolve(source.path, base_dir)
        if not (folder / "config.json").is_file():
            raise ModelNotFound(f"{field}.path: {folder} is not a Hugging Face folder (no config.json)")
        return folder
    if source.gguf is not None:
        file = _resolve(source.gguf, base_dir)
        if not file.is_file():
            raise ModelNotFound(f"{field}.gguf: {file} does not exist")
        return gguf_to_hf_folder(file)
    if source.hub_id is not None:
        if _offline(os.environ.get("HF_HUB_OFFLINE")):
            return _cached_hub_folder(source, field)
        from huggingface_hub import snapshot_download

        # The token, when the job gives one, arrives as HF_TOKEN from a Secret (never in the config).
        return Path(snapshot_download(source.hub_id, revision=source.revision, token=os.environ.get("HF_TOKEN")))
    raise ModelNotFound(f"{field}: no source given (path, gguf or hubId)")


def _offline(value: str | None) -> bool:
    # The values huggingface_hub itself takes for true (constants._is_true).
    return (value or "").upper() in {"1", "ON", "YES", "TRUE"}


def _cached_hub_folder(source: WeightsSource, field: str) -> Path:
    """The snapshot the initializer fetched into the hub cache, without any request.

    Trainer pods on a cluster run with HF_HUB_OFFLINE=1 and the cache volume mounted read-only: the
    initializer (`kuberl initialize`) fetched every hub source before they started. A missing snapshot
    means it did not, and no retry in this pod can mend that.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    from ..common.hub_folders import DEFAULT_ENDPOINT, endpoint_cache_dir

    # The folder of the hub the initializer fetched from (HF_ENDPOINT, as it had it): each endpoint has its own.
    where = endpoint_cache_dir(
        Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser().resolve(),
        os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT,
    )
    try:
        return Path(snapshot_download(source.hub_id, revision=source.revision, cache_dir=where, local_files_only=True))
    except EntryNotFoundError as exc:  # LocalEntryNotFoundError, IncompleteSnapshotError
        raise ModelNotFound(
            f"{field}.hubId {source.hub_id} (revision {source.revision or 'main'}) is not in the hub cache "
            f"(HF_HUB_CACHE={where}), and this pod is offline (HF_HUB_OFFLINE=1): the initializer did not fetch "
            f"it; see the initializer pod's log and the RLJob's status ({' '.join(str(exc).split())[:200]})"
        ) from exc


def _resolve(path: str, base_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()

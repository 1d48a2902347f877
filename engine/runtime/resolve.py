"""Where a model's Hugging Face folder is, for each kind of source a job may name."""

from __future__ import annotations

import os
from pathlib import Path

from ..config.model import WeightsSource
from ..models.loading import gguf_to_hf_folder


class ModelNotFound(FileNotFoundError):
    """The model a job names is not where it says; the message names the field."""


def model_folder(source: WeightsSource, base_dir: Path = Path(".")) -> Path:
    """A Hugging Face folder for `source`: the folder itself, a GGUF file converted once (cached), or a hub download."""
    if source.path is not None:
        folder = _resolve(source.path, base_dir)
        if not (folder / "config.json").is_file():
            raise ModelNotFound(f"model.path: {folder} is not a Hugging Face folder (no config.json)")
        return folder
    if source.gguf is not None:
        file = _resolve(source.gguf, base_dir)
        if not file.is_file():
            raise ModelNotFound(f"model.gguf: {file} does not exist")
        return gguf_to_hf_folder(file)
    if source.hub_id is not None:
        from huggingface_hub import snapshot_download

        # The token, when the job gives one, arrives as HF_TOKEN from a Secret (never in the config).
        return Path(snapshot_download(source.hub_id, revision=source.revision, token=os.environ.get("HF_TOKEN")))
    raise ModelNotFound("model: no source given (path, gguf or hubId)")


def _resolve(path: str, base_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()

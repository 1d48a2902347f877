"""Whether the engine can train a model as a job lays it out: read from its config.json before any pod loads it.

The initializer runs this on the model it fetched (a hub repository), and `kuberl validate --local` on a model
folder it can read, so an unsupported family, rope or layout is refused before the trainer pods start and
download or load anything; the ranks check the same again when they build the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..config.topology import EngineConfig
from .arch import LlamaArch, UnsupportedModel
from .families import family_of


MAX_CONFIG_BYTES = 1 << 20
"""A model's config.json is a few kilobytes; anything larger is not one (and is not read whole)."""


def read_model_config(path: Path) -> dict[str, Any]:
    """A model folder's config.json as a dict; ValueError saying why for anything else."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes: not a model's config.json")
    config = json.loads(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object")
    return config


def check_model(hf_config: Mapping[str, Any], config: EngineConfig) -> LlamaArch:
    """The model's shape, if every role that loads it can split it its way; else UnsupportedModel naming the role."""
    arch = LlamaArch.from_hf_config(hf_config)
    family = family_of(hf_config.get("model_type"))
    if family.job_refusal is not None:
        kind = "a mixture-of-experts model" if family.is_moe else f"a {family.name} model"
        raise UnsupportedModel(f"{hf_config.get('model_type')} is {kind}: {family.job_refusal}")
    if arch.is_moe and config.trainer.lora is not None:
        raise UnsupportedModel(f"trainer.lora: {arch.LORA_ON_EXPERTS}")
    for role, topo in config.roles.items():
        if role == "reward":  # a reward model is a model of its own (reward.model), read where it is loaded
            continue
        tp, pp, ep = topo.layout.tp, topo.layout.pp, topo.layout.expert_parallel
        try:
            arch.check_layout(tp, pp, ep)
        except UnsupportedModel as exc:
            raise UnsupportedModel(f"roles.{role}.layout: {exc}") from None
    return arch

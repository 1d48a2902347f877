"""What a LoRA run (trainer.lora) adds to runtime/rl.py: the adapter's switch, its export, and the
base model its checkpoints name.

A LoRA checkpoint holds the adapter and its optimizer state (MegatronLM.state_dict) and, in its
meta.json, the base model it was trained on: the folder (and its config's fingerprint), which a
resume loads again. The export writes the adapter as a PEFT folder at trainer.exportPath and, when
lora.mergedExportPath is set, the base with the adapter merged in as a Hugging Face folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..config.lora import LoRASpec
from ..hybrid.adapter import AdapterGather
from ..models.arch import LlamaArch
from ..models.loading import export_hf_folder, export_peft_folder, read_hf_state_dict
from ..models.lora_layout import adapter_config, merged

log = logging.getLogger("kuberl.engine")


def adapter_gather(arch: LlamaArch, spec: LoRASpec, place: Any) -> AdapterGather:
    """The adapter's switch for this rank's place (a training.policy.ModelPlace) in the actor's layout."""
    from megatron.core import parallel_state as ps

    return AdapterGather(
        arch, list(spec.target_modules), (place.pp_rank, place.tp_rank), ps.get_model_parallel_group(), place.tp * place.pp
    )


def base_reference(folder: Path, hf_config: dict, spec: LoRASpec) -> dict[str, Any]:
    """What a LoRA checkpoint's meta.json says of the base model its adapter applies to."""
    fingerprint = hashlib.sha256(json.dumps(hf_config, sort_keys=True).encode()).hexdigest()[:16]
    return {"base_model": {"path": str(folder), "config_sha256": fingerprint}, "lora": spec.to_manifest()}


def check_base(step_folder: Path, folder: Path, hf_config: dict, spec: LoRASpec) -> None:
    """Refuse to resume a LoRA checkpoint onto another base model than the one it was trained on."""
    saved = json.loads((step_folder / "meta.json").read_text()).get("base_model")
    if saved is None:
        raise RuntimeError("the checkpoint holds full weights, not a LoRA adapter: it cannot resume a trainer.lora run")
    expected = base_reference(folder, hf_config, spec)["base_model"]
    if saved["config_sha256"] != expected["config_sha256"]:
        raise RuntimeError(f"the checkpoint's adapter was trained on {saved['path']}, whose config differs from {folder}'s")


def export(gather: AdapterGather, local: dict, spec: LoRASpec, folder: Path, hf_config: dict, out: Path, is_controller: bool) -> None:
    """Every rank of the actor: gather the adapter; the controller writes the folders."""
    adapter = gather.gather(local)
    if is_controller:
        export_peft_folder(adapter, adapter_config(spec, str(folder)), out, tokenizer_from=folder)
        log.info("exported the LoRA adapter to %s", out)
        if spec.merged_export_path:
            target = Path(spec.merged_export_path).expanduser()
            export_hf_folder(merged(read_hf_state_dict(folder), adapter, spec.scale()), hf_config, target, tokenizer_from=folder)
            log.info("exported the merged policy to %s", target)
    dist.barrier()

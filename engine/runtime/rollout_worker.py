"""What the ranks of roles.rollout run (rollout.placement: separate): a vLLM engine per rank, fed by the controller.

Commands over the role's link (distributed/rollout_fleet.py sends them, in order): "weights" (a new
policy version arrives bucket by bucket, distributed/weight_stream.py, and is loaded in place),
"adapter" (with trainer.lora, the version's adapter instead, on the base the engine loaded at the start),
"generate" (the rank's share of a batch's prompts, seeded as the actor's own replicas would be; the
role's first rank replies with every completion, each token stamped with the version this role
held), "stopping", "stop". The ranks keep nothing to resume: the controller writes their (empty)
parts of each checkpoint, and a resumed run sends its weights before the first batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from ..common.dtypes import vllm_dtype
from ..config.topology import EngineConfig
from ..distributed.role_link import RoleLink, serve_commands
from ..distributed.role_worlds import RoleWorld
from ..distributed.rollout_fleet import GenerateReply, GenerateRequest
from ..distributed.weight_stream import receive_buckets
from ..rollout.fleet_load import ReplicaClock
from .builders import model_files
from .stopping import StopRequest, agree

log = logging.getLogger("kuberl.engine")


class RolloutWorker:
    def __init__(self, config: EngineConfig, world: RoleWorld, base_dir: Path = Path(".")):
        from ..rollout.generation import Generator
        from ..rollout.vllm_backend import VLLMRollout

        self.config, self.world = config, world
        self.link = RoleLink("rollout", world.links["rollout"])
        spec = config.rollout
        assert spec is not None
        files = model_files(config, base_dir)
        self.replica, self.replicas = dist.get_rank(), dist.get_world_size()
        # Replica i is seeded as the actor's replica i would be when it generates itself (builders.build_rollout).
        self.rollout = VLLMRollout(
            files.folder,
            dtype=vllm_dtype(files.dtype),
            seed=config.trainer.seed + self.replica,
            max_model_len=config.data.max_prompt_length + spec.max_response_tokens,
            kv_cache_bytes=spec.kv_cache_bytes,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            skip_tokenizer_init=True,
            lora_rank=config.trainer.lora.rank if config.trainer.lora is not None else None,
        )
        self.generator = Generator(self.rollout, self.replica, self.replicas, 1)
        self.version = -1
        """The policy version of the weights this rank's engine holds (-1: the model folder's, before the first sync)."""
        block = world.block
        log.info("role rollout ready on ranks %d..%d (%d vLLM engine(s))", block.offset, block.offset + block.size - 1, self.replicas)

    def serve(self, stop: StopRequest | None = None) -> bool:
        self.stop = stop or StopRequest()
        self.stop.steps_begin()
        self.clock = ReplicaClock(self.replica)
        return serve_commands(self.link, self)

    def _weights(self, payload: dict[str, Any]) -> dict[str, float]:
        return self._load(payload, lambda: self.rollout.update_weights(receive_buckets(self.link.link)))

    def _adapter(self, payload: dict[str, Any]) -> dict[str, float]:
        """trainer.lora: sample with this adapter (PEFT names and config) on the base loaded at the start."""
        return self._load(payload, lambda: self.rollout.update_adapter(payload["tensors"], payload["config"]))

    def _load(self, payload: dict[str, Any], load: Callable[[], int]) -> dict[str, float]:
        """Run `load` (it returns the bytes it took in) and hold the payload's version from then on."""
        with self.clock.command():
            started = time.perf_counter()
            received = load()
            self.version = int(payload["version"])
            return {"seconds": time.perf_counter() - started, "bytes": float(received)}

    def _generate(self, request: GenerateRequest) -> GenerateReply:
        with self.clock.command():
            if request.version != self.version:
                raise RuntimeError(f"asked to generate with version {request.version}, but this engine holds version {self.version}")
            started = time.perf_counter()
            completions = self.generator.generate(request.prompts, request.sampling, request.seed + self.replica)
            self.clock.generated(self.generator.generated_tokens, time.perf_counter() - started)
            loads: list[Any] = [None] * self.replicas
            dist.all_gather_object(loads, self.clock.take())
            return GenerateReply([replace(c, versions=(self.version,) * len(c.token_ids)) for c in completions], loads)

    def _stopping(self, payload: None) -> bool:
        with self.clock.command():
            return agree(self.stop.requested)

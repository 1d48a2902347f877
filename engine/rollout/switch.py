"""The hybrid engine's switch between training and generation on one rank.

To generation: make room (GPU: optimizer state and gradients leave the device), wake vLLM, and
stream the actor's current weights into this rank's replica. Back: vLLM sleeps (GPU: KV cache
freed, its weights to host memory) and the optimizer state and gradient buffers return. Weights
stream only when the actor changed since the last time, so a step that generates twice (dynamic
sampling) pays for one stream.

A LoRA actor (adapter given) streams its adapter alone: gathered from the model-parallel group
(hybrid/adapter.py) and handed to vLLM, which keeps the base weights it loaded at the start. Its
metrics say what moved (`adapter_bytes`, `adapter_seconds`) beside what the full-weight switch
would have handed vLLM (`switch_full_bytes`); `switch_bytes` is what was handed over, either way.
"""

from __future__ import annotations

import time
from typing import Any

from ..training.policy import MegatronLM


class HybridSwitch:
    def __init__(
        self,
        actor: MegatronLM,
        critic: MegatronLM | None,
        rollout: Any,
        resharder: Any,
        adapter: Any = None,
        adapter_config: dict | None = None,
    ):
        self.actor, self.critic, self.rollout, self.resharder = actor, critic, rollout, resharder
        self.adapter, self.adapter_config = adapter, adapter_config
        self.full_bytes = float(
            sum(piece.numel() for bucket in resharder.plan for unit in bucket for piece in unit.pieces) * resharder.element_size
        )
        """The model's bytes: what the full-weight switch hands vLLM."""
        self.generating = False
        self.weights_current = False
        """vLLM holds the actor's current weights (cleared by every update of the actor)."""

    def to_rollout(self) -> dict[str, float]:
        """Into generation mode; returns what it moved (zeros when already there with current weights)."""
        stats = {"reshard_seconds": 0.0, "reshard_bytes": 0.0, "offloaded_bytes": 0.0}
        if not self.generating:
            stats["offloaded_bytes"] = float(sum(model.offload() for model in self._trained()))
            self.rollout.wake_up()  # GPU: vLLM's weights and KV cache come back (no-op on CPU)
            self.generating = True
        if not self.weights_current:
            stats.update(self._send_adapter() if self.adapter is not None else self._send_weights())
            stats["switch_full_bytes"] = self.full_bytes
            self.weights_current = True
        return stats

    def _send_weights(self) -> dict[str, float]:
        handed = self.rollout.update_weights(self.resharder.stream(self.actor.megatron_state()))
        moved = self.resharder.stats.history[-1]
        return {"reshard_seconds": moved["seconds"], "reshard_bytes": moved["bytes_received"], "switch_bytes": float(handed)}

    def _send_adapter(self) -> dict[str, float]:
        started = time.perf_counter()
        tensors = self.adapter.gather(self.actor.adapters.state())
        handed = self.rollout.update_adapter(tensors, self.adapter_config)
        seconds = time.perf_counter() - started
        received = self.adapter.stats.history[-1]["bytes_received"]
        return {
            "reshard_seconds": seconds,
            "reshard_bytes": float(received),
            "switch_bytes": float(handed),
            "adapter_bytes": float(handed),
            "adapter_received_bytes": float(received),
            "adapter_seconds": seconds,
        }

    def to_training(self) -> None:
        """Into training mode (nothing to do when already there). On CPU nothing moves."""
        if not self.generating:
            return
        self.rollout.sleep()
        for model in self._trained():
            model.onload()
        self.generating = False

    def actor_changed(self) -> None:
        self.weights_current = False

    def _trained(self) -> list[MegatronLM]:
        return [m for m in (self.actor, self.critic) if m is not None]

"""The hybrid engine's switch between training and generation on one rank.

To generation: make room (GPU: optimizer state and gradients leave the device), wake vLLM, and
stream the actor's current weights into this rank's replica. Back: vLLM sleeps (GPU: KV cache
freed, its weights to host memory) and the optimizer state and gradient buffers return. Weights
stream only when the actor changed since the last time, so a step that generates twice (dynamic
sampling) pays for one stream.
"""

from __future__ import annotations

from typing import Any

from .policy import MegatronLM


class HybridSwitch:
    def __init__(self, actor: MegatronLM, critic: MegatronLM | None, rollout: Any, resharder: Any):
        self.actor, self.critic, self.rollout, self.resharder = actor, critic, rollout, resharder
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
            self.rollout.update_weights(self.resharder.stream(self.actor.megatron_state()))
            moved = self.resharder.stats.history[-1]
            stats["reshard_seconds"], stats["reshard_bytes"] = moved["seconds"], moved["bytes_received"]
            self.weights_current = True
        return stats

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

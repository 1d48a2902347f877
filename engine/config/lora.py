"""LoRA: train low-rank adapters on the frozen base model instead of every weight (trainer.lora)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import LocalPath, Rule, SpecModel

LoRATarget = Literal["q", "k", "v", "o", "gate", "up", "down"]
ALL_TARGETS: tuple[LoRATarget, ...] = ("q", "k", "v", "o", "gate", "up", "down")

# Hugging Face's (and PEFT's) module name of each target.
HF_MODULES: dict[str, str] = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
}


class LoRASpec(SpecModel):
    """Low-rank adapters on the actor's linear layers (PEFT's LoRA: W x + alpha/rank * B A x).

    The base weights are frozen and loaded into vLLM once; only the adapters (and their optimizer
    state) train, are checkpointed and move into vLLM at each switch. The reference policy is the
    base model with the adapter off: no second copy of the weights. A critic, when the algorithm has
    one, trains all its weights: its value head is new and must learn from scratch.
    """

    rank: int = Field(default=16, ge=1, le=512)
    """The adapters' rank r: A is [r, in], B is [out, r]. At most 512, the largest rank vLLM serves."""
    alpha: float = Field(default=32.0, gt=0.0, le=100_000.0)
    """Scale numerator: the adapter adds alpha/rank * B A x (PEFT's lora_alpha). Above 0 (0 would switch
    the adapter off)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input while training (PEFT's lora_dropout); below 1, which drops everything."""
    target_modules: list[LoRATarget] = Field(default_factory=lambda: list(ALL_TARGETS), min_length=1, max_length=7)
    """The linear layers that get an adapter, by their Hugging Face names without `_proj`: attention's q,
    k, v, o and the MLP's gate, up, down. Default: all of them (LoRA works best on every layer)."""
    merged_export_path: LocalPath | None = None
    """Also write the merged policy (base + adapter) there as a Hugging Face folder; trainer.exportPath
    gets the adapter alone, in PEFT's format."""

    RULES = (
        Rule(
            message="targetModules lists a layer twice",
            check=lambda s: len(set(s.target_modules)) == len(s.target_modules),
            cel="!has(self.targetModules) || self.targetModules.all(m, self.targetModules.exists_one(x, x == m))",
            field="targetModules",
        ),
    )

    def scale(self) -> float:
        return self.alpha / self.rank

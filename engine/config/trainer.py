"""How long to train, in what batches, with which optimizer, and where checkpoints go."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import LocalPath, Rule, SpecModel
from .lora import LoRASpec
from .model import DNS_SUBDOMAIN


class OptimizerSpec(SpecModel):
    """The optimizer of every trained role (actor and critic)."""

    name: Literal["adamw", "adam", "sgd"] = "adamw"
    """The optimizer (megatron-core's distributed optimizer runs it)."""
    lr: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Peak learning rate; above 0 (0 would not train) and at most 1, far past any stable rate for a language model."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """Decoupled weight decay, 0..1 (at 1 each step would erase the weights at the full learning rate)."""
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Decay of the gradient's moving average; below 1, where the average would never move."""
    beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    """Decay of the squared gradient's moving average; below 1, where the average would never move."""
    eps: float = Field(default=1e-8, gt=0.0, le=1.0)
    """Added to the denominator; above 0, which could divide by zero."""
    grad_clip: float = Field(default=1.0, ge=0.0, le=1e6)
    """Clip the global gradient norm to this; 0 disables clipping (a norm cannot be negative)."""
    warmup_steps: int = Field(default=0, ge=0, le=10_000_000)
    """Steps of linear warm-up from 0 to lr."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after the warm-up."""

    RULES = (
        Rule(
            message="sgd has no betas",
            check=lambda s: s.name != "sgd" or (s.beta1 == 0.9 and s.beta2 == 0.999),
            cel="self.name != 'sgd' || (self.beta1 == 0.9 && self.beta2 == 0.999)",
            field="beta1",
        ),
    )


class CheckpointSpec(SpecModel):
    """Checkpoints: model, optimizer, data position, RNG states and step."""

    path: LocalPath = "/checkpoints"
    """A directory: local for `kuberl run`, the mount point of claimName on a cluster."""
    claim_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """A PersistentVolumeClaim mounted at path in every pod; without one, a restarted pod cannot resume."""
    interval: int = Field(default=50, ge=1, le=10_000_000)
    """Steps between checkpoints (the last step is always saved)."""
    keep: int = Field(default=3, ge=1, le=1000)
    """How many of the newest checkpoints to keep."""


class TrainerSpec(SpecModel):
    """The training loop."""

    total_steps: int | None = Field(default=None, ge=1, le=10_000_000)
    """Stop after this many RL steps."""
    total_epochs: int | None = Field(default=None, ge=1, le=100_000)
    """Stop after this many passes over the training prompts."""
    prompts_per_step: int = Field(default=8, ge=1, le=1_000_000)
    """Prompts per RL step (preference pairs for dpo)."""
    mini_batch_size: int | None = Field(default=None, ge=1, le=100_000_000)
    """Sequences per optimizer update; default: all of a step's sequences in one update."""
    micro_batch_size: int = Field(default=1, ge=1, le=1_000_000)
    """Sequences per rank in one forward and backward pass (gradient accumulation below the
    mini-batch). Memory, not the update: each micro-batch's loss counts for its share of the
    mini-batch's tokens (or sequences), so every cut gives the same update."""
    micro_batch_tokens: int | None = Field(default=None, ge=16, le=1_000_000)
    """Fill micro-batches up to this many tokens instead of microBatchSize sequences, and split a
    batch over DP ranks by tokens (like verl's dynamic batch size); needs sequencePacking. A
    sequence longer than the budget is a micro-batch of its own. Like microBatchSize it changes
    how much is computed at once, not the update."""
    sequence_packing: bool = True
    """Lay each micro-batch out as one flat run of its sequences, no padding, attention per
    sequence (with sharedPrefix: per prompt and its samples); false: one right-padded row per
    sequence."""
    shared_prefix: bool = True
    """With sequencePacking: the samples of one prompt in a micro-batch share one copy of the prompt."""
    optimizer: OptimizerSpec = OptimizerSpec()
    seed: int = Field(default=42, ge=0, le=2**32 - 1)
    """Seeds data order, sampling and initialisation; a run is reproducible on the same hardware."""
    collective_timeout_seconds: int = Field(default=600, ge=30, le=86_400)
    """How long a rank waits for its peers (joining, or in a collective) before it gives up: a job whose rank
    died or hangs fails this long after, and the gang restarts. Raise it above the longest wait of a step
    (a long generation or reward phase of a large model)."""
    checkpoint: CheckpointSpec = CheckpointSpec()
    validation_interval: int = Field(default=0, ge=0, le=10_000_000)
    """Steps between validation runs on data.validation; 0 disables them."""
    export_path: LocalPath | None = None
    """Write the final policy there as a Hugging Face folder (with lora: the adapter, as a PEFT folder)."""
    lora: LoRASpec | None = None
    """Train low-rank adapters on the frozen base model instead of every weight of the actor."""

    RULES = (
        Rule(
            message="microBatchTokens needs sequencePacking: a token budget fills packed runs",
            check=lambda s: s.micro_batch_tokens is None or s.sequence_packing,
            cel="!has(self.microBatchTokens) || !has(self.sequencePacking) || self.sequencePacking",
            field="microBatchTokens",
        ),
        Rule(
            message="set exactly one of totalSteps and totalEpochs",
            check=lambda s: (s.total_steps is None) != (s.total_epochs is None),
            cel="has(self.totalSteps) != has(self.totalEpochs)",
        ),
        Rule(
            message="optimizer.warmupSteps must be fewer than totalSteps: the learning rate would never reach optimizer.lr",
            check=lambda s: s.total_steps is None or s.optimizer.warmup_steps < s.total_steps,
            cel="!has(self.totalSteps) || self.optimizer.warmupSteps < self.totalSteps",
            field="optimizer.warmupSteps",
            detail=lambda s: f"warmupSteps {s.optimizer.warmup_steps}, totalSteps {s.total_steps}",
        ),
        Rule(
            message="lora.mergedExportPath needs exportPath, where the adapter itself is exported",
            check=lambda s: s.lora is None or s.lora.merged_export_path is None or s.export_path is not None,
            cel="!has(self.lora) || !has(self.lora.mergedExportPath) || has(self.exportPath)",
            field="lora.mergedExportPath",
        ),
    )

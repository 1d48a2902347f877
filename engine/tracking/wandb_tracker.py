"""Weights & Biases: one run per job (its id kept for resumption), online or offline."""

from __future__ import annotations

import secrets
from pathlib import Path

from ..config.tracking import TrackingSpec
from .registry import TrackerContext, register_tracker


class WandbTracker:
    def __init__(self, spec: TrackingSpec, ctx: TrackerContext):
        import wandb

        self.run_id = ctx.run_id or secrets.token_hex(6)  # W&B's ids are lowercase letters and digits
        # The API key comes from WANDB_API_KEY (a Secret in the pods); it is never an argument here.
        self.run = wandb.init(
            project=spec.project,
            entity=spec.entity,
            mode=spec.mode or "online",
            dir=str(ctx.run_dir),
            id=self.run_id,
            resume="allow",
            name=ctx.job,
            config=ctx.params if ctx.run_id is None else None,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def artifact(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self) -> None:
        self.run.finish()


@register_tracker("wandb", module="wandb", extra="wandb")
def open_wandb(spec: TrackingSpec, ctx: TrackerContext) -> WandbTracker:
    return WandbTracker(spec, ctx)

"""TensorBoard: event files in a folder of the run (torch's SummaryWriter)."""

from __future__ import annotations

import json
from pathlib import Path

from ..config.tracking import TrackingSpec
from .registry import TrackerContext, register_tracker


class TensorBoardTracker:
    def __init__(self, spec: TrackingSpec, ctx: TrackerContext):
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(spec.path).expanduser() if spec.path else ctx.run_dir / "tensorboard"
        self.run_id = str(folder)
        # A resumed job rewrites the steps after its checkpoint: purge what a crashed attempt wrote
        # past it, so that every step appears once.
        self.writer = SummaryWriter(str(folder), purge_step=ctx.resumed_at + 1 if ctx.resumed_at else None)
        if not ctx.resumed_at:
            self.writer.add_text("config", "```\n" + json.dumps(ctx.params, indent=1, sort_keys=True) + "\n```", 0)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def artifact(self, path: Path) -> None:
        if path.suffix == ".png":
            import numpy as np
            from PIL import Image

            self.writer.add_image(path.stem, np.asarray(Image.open(path).convert("RGB")), dataformats="HWC")
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@register_tracker("tensorboard", module="tensorboard", extra="tensorboard")
def open_tensorboard(spec: TrackingSpec, ctx: TrackerContext) -> TensorBoardTracker:
    return TensorBoardTracker(spec, ctx)

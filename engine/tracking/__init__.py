"""Experiment tracking: TensorBoard, MLflow and W&B receive what metrics.jsonl receives.

registry.py: the backends by name; one file each (tensorboard_tracker, mlflow_tracker,
wandb_tracker); grouping.py: the metric names trackers see; fanout.py: all of a job's trackers.
"""

from .fanout import RUN_IDS_FILE, Trackers, TrackingError, check_available
from .grouping import flat_params, tracked_scalars
from .registry import TRACKERS, Tracker, TrackerContext, register_tracker

__all__ = [
    "RUN_IDS_FILE",
    "TRACKERS",
    "Tracker",
    "TrackerContext",
    "Trackers",
    "TrackingError",
    "check_available",
    "flat_params",
    "register_tracker",
    "tracked_scalars",
]

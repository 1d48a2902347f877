"""Reading back what the trackers wrote, from their own files, for tests: TensorBoard's event files
through tensorboard's reader, and W&B's offline run log (no public reader exists for it: its
records are W&B's protobuf messages in a LevelDB-style log, read here with W&B's own messages)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

_WANDB_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def tensorboard_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of `tag` in the folder's event files, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return sorted((e.step, e.value) for e in acc.Scalars(tag))


def _wandb_records(path: Path):
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path} is not a W&B run log")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = _WANDB_BLOCK - pos % _WANDB_BLOCK
        if left < 7:  # a record header never spans two blocks: the rest of the block is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


def wandb_runs(folder: Path) -> list[dict]:
    """Every offline run folder under `folder` (W&B's `wandb/` dir), oldest first: its run id, its
    config keys, and its history rows {metric: value} with `_step`."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs = []
    for log in sorted(folder.glob("offline-run-*/run-*.wandb")):
        run: dict = {"folder": log.parent, "id": None, "config": {}, "history": []}
        for raw in _wandb_records(log):
            record = pb.Record()  # type: ignore[attr-defined]  # generated protobuf: its classes are made at import
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"] = record.run.run_id
                run["config"].update({item.key: item.value_json for item in record.run.config.update})
            elif kind == "history":
                run["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
        runs.append(run)
    return runs

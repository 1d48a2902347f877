"""Policy weights from the trainer to rollout ranks of their own, bucket by bucket, over torch.distributed.

The actor's ranks gather the whole model with the hybrid switch's plan (hybrid/plan.py, t_g = 1):
the same buckets, the same Hugging Face tensors, so the bytes are the plan's. The controller then
sends each bucket over the rollout role's link group (gloo here, between any devices): first what
the bucket holds (`BucketHeader`, pickled), then its tensors as one flat buffer that every rollout
rank receives at once. The rollout ranks hand each bucket to vLLM's reload as it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch

from .role_worlds import ObjectLink


@dataclass(frozen=True)
class BucketHeader:
    """What one bucket carries: its tensors' Hugging Face names and shapes, and their dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str

    @property
    def numel(self) -> int:
        total = 0
        for shape in self.shapes:
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()


@dataclass(frozen=True)
class WeightBucket:
    header: BucketHeader
    flat: torch.Tensor
    """The bucket's tensors, flattened and concatenated in header order (on the CPU)."""


def gather_buckets(resharder: Any, local: dict[str, torch.Tensor], keep: bool) -> list[WeightBucket]:
    """The whole model in the switch plan's buckets (a collective over the actor's model-parallel group:
    every rank calls it); `keep`: this rank keeps the copies (the controller), others drop them."""
    out: list[WeightBucket] = []
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    seen = resharder.stats.buckets

    def close() -> None:
        if names and keep:
            header = BucketHeader(tuple(names), tuple(tuple(t.shape) for t in tensors), str(tensors[0].dtype).removeprefix("torch."))
            out.append(WeightBucket(header, torch.cat([t.detach().reshape(-1).cpu() for t in tensors])))
        names.clear()
        tensors.clear()

    for name, tensor in resharder.stream(local):
        if resharder.stats.buckets != seen:  # the plan moved on to its next bucket
            seen = resharder.stats.buckets
            close()
        names.append(name)
        tensors.append(tensor)
    close()
    return out


def send_buckets(link: ObjectLink, buckets: list[WeightBucket], root: int = 0) -> int:
    """The controller's half: every bucket to every other rank of the link; returns the bytes sent."""
    link.broadcast([b.header for b in buckets], root=root)
    sent = 0
    for bucket in buckets:
        link.broadcast_tensor(bucket.flat.contiguous(), root)
        sent += bucket.flat.numel() * bucket.flat.element_size()
    return sent


def receive_buckets(link: ObjectLink, root: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """A rollout rank's half: (Hugging Face name, tensor) as each bucket arrives. A collective over the
    link: every rollout rank must walk it to the end."""
    headers: list[BucketHeader] = link.broadcast(None, root=root)
    for header in headers:
        flat = torch.empty(header.numel, dtype=getattr(torch, header.dtype))
        link.broadcast_tensor(flat, root)
        offset = 0
        for name, shape in zip(header.names, header.shapes):
            n = 1
            for s in shape:
                n *= s
            yield name, flat[offset : offset + n].view(shape)
            offset += n

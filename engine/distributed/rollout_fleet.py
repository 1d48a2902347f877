"""The actor's side of a rollout role on ranks of its own (rollout.placement: separate).

The controller (global rank 0) owns the rollout link. One thread of the controller walks it: every
command (weights of a version, a batch to generate, stopping, stop) is sent and answered in the
order it was submitted, so the gloo collectives of the link stay in step with the rollout ranks'
while the main thread trains. A batch submitted now is generated with the last weights submitted
before it; its tokens carry that version. Every actor rank calls the same methods in the same order
(SPMD): the weights' gather is a collective of the actor's model-parallel group, and every actor rank
gets each batch's completions from the controller.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch.distributed as dist

from ..rollout.fleet_load import ReplicaLoad
from ..rollout.vllm_backend import Completion, Sampling
from .role_link import RoleLink
from .weight_stream import gather_buckets, send_buckets


class LinkThread:
    """Runs submitted calls one after another on a daemon thread: a rank that fails while the thread
    waits on the link still exits (a pool's thread would hold the process until the link timed out)."""

    def __init__(self, name: str):
        self.calls: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self.calls.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """End the thread once the calls submitted before are done, and wait for it."""
        self.calls.put(None)
        self.thread.join()

    def _work(self) -> None:
        while (item := self.calls.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)


@dataclass(frozen=True)
class GenerateRequest:
    """What the controller sends the rollout role for one batch (its reply: list[Completion])."""

    prompts: list[list[int]]
    sampling: Sampling
    seed: int
    """The seed of the first replica; replica i samples with seed + i (as the actor's replicas do)."""
    version: int
    """The version of the weights the role holds when it takes this request (stamped on every token)."""


@dataclass(frozen=True)
class GenerateReply:
    """The rollout role's answer to a GenerateRequest."""

    completions: list[Completion]
    loads: list[ReplicaLoad]
    """Every rollout replica's account of its time since its previous reply."""


@dataclass
class Ticket:
    """A batch on its way: on the controller, the future of its completions."""

    version: int
    future: Future | None
    loads: list[ReplicaLoad] = field(default_factory=list)
    """Once its completions came (controller): every rollout replica's account since its previous reply."""


@dataclass(frozen=True)
class AdapterSource:
    """With trainer.lora: what goes to the rollout role instead of the whole model."""

    gather: Callable[[], dict[str, Any]]
    """The actor's adapter by PEFT name (a collective over the actor's model-parallel group)."""
    config: dict[str, Any]
    """Its PEFT adapter_config."""


def _sync_stats(version: int, seconds: float, sent: float, buckets: int, load_seconds: float) -> dict[str, float]:
    """One weight sync's metrics (summed over the syncs of a step by sync_metrics)."""
    return {
        "weight_sync_seconds": seconds,
        "weight_sync_bytes": float(sent),
        "weight_sync_buckets": float(buckets),
        "weight_sync_version": float(version),
        "weight_sync_load_seconds": float(load_seconds),
    }


class RolloutFleet:
    def __init__(
        self, link: RoleLink | None, resharder: Any, actor: Any, is_controller: bool, world: int, adapter: AdapterSource | None = None
    ):
        self.link, self.resharder, self.actor, self.adapter = link, resharder, actor, adapter
        self.is_controller, self.world = is_controller, world
        self.thread = LinkThread("rollout-link") if is_controller else None
        self.version = -1
        """The version of the weights last submitted to the role (-1: none yet)."""
        self._syncs: list[Future] = []
        self._stopping: Future | None = None
        self.model_bytes = float(
            sum(piece.numel() for bucket in resharder.plan for unit in bucket for piece in unit.pieces) * resharder.element_size
        )
        """The model's bytes in the switch plan: what one version's weights move to every rollout rank."""

    # -- weights ------------------------------------------------------------------------------------

    def sync(self, version: int) -> None:
        """Send the actor's current weights as `version`, unless the role has them already. Collective:
        every actor rank gathers; the controller's thread sends while the main thread goes on."""
        if version == self.version:
            return
        started = time.perf_counter()
        if self.adapter is not None:  # LoRA: the adapter alone, the base stays as the role loaded it
            tensors = self.adapter.gather()
            gathered = time.perf_counter() - started
            self.version = version
            if self.thread is not None:
                self._syncs.append(self.thread.submit(self._send_adapter, version, tensors, gathered))
            return
        buckets = gather_buckets(self.resharder, self.actor.megatron_state(), keep=self.is_controller)
        gathered = time.perf_counter() - started
        self.version = version
        if self.thread is not None:  # the controller
            self._syncs.append(self.thread.submit(self._send_weights, version, buckets, gathered))

    def _send_weights(self, version: int, buckets: list, gathered: float) -> dict[str, float]:
        started = time.perf_counter()
        assert self.link is not None
        self.link.send("weights", {"version": version})
        sent = send_buckets(self.link.link, buckets)
        loaded = self.link.result()
        return _sync_stats(version, gathered + time.perf_counter() - started, sent, len(buckets), loaded["seconds"])

    def _send_adapter(self, version: int, tensors: dict[str, Any], gathered: float) -> dict[str, float]:
        started = time.perf_counter()
        assert self.link is not None and self.adapter is not None
        loaded = self.link.call("adapter", {"version": version, "tensors": tensors, "config": self.adapter.config})
        return _sync_stats(version, gathered + time.perf_counter() - started, loaded["bytes"], 1, loaded["seconds"])

    def sync_metrics(self) -> dict[str, float]:
        """What the syncs finished since the last call moved (controller; empty elsewhere): sums of seconds
        and bytes, the newest version."""
        done = [f for f in self._syncs if f.done()]
        self._syncs = [f for f in self._syncs if not f.done()]
        out: dict[str, float] = {}
        for future in done:
            stats = future.result()
            for key, value in stats.items():
                out[key] = value if key == "weight_sync_version" else out.get(key, 0.0) + value
        if out:
            out["weight_sync_model_bytes"] = self.model_bytes
        return out

    # -- batches ------------------------------------------------------------------------------------

    def submit(self, prompts: list[list[int]], sampling: Sampling, seed: int) -> Ticket:
        """Generate `prompts` with the weights last synced (sync first); returns at once."""
        assert self.version >= 0, "sync the weights before the first batch"
        request = GenerateRequest(prompts, sampling, seed, self.version)
        future = self.thread.submit(self._call, "generate", request) if self.thread is not None else None
        return Ticket(self.version, future)

    def result(self, ticket: Ticket) -> list[Completion]:
        """The batch's completions, every token stamped with its version, on every actor rank."""
        reply: GenerateReply | None = ticket.future.result() if ticket.future is not None else None
        if reply is not None:
            ticket.loads = reply.loads
        holder: list[Any] = [reply.completions if reply is not None else None]
        if self.world > 1:
            dist.broadcast_object_list(holder, src=0)
        completions: list[Completion] = holder[0]
        return [c if c.versions is not None else replace(c, versions=(ticket.version,) * len(c.token_ids)) for c in completions]

    # -- the rest of the role's commands ------------------------------------------------------------

    def stopping(self) -> bool:
        """Whether a rollout rank was signalled to stop, by the last answer that has come (controller).
        Never waits: the question queues behind the batches on their way, so the answer is asked now
        and read at a later step boundary."""
        answer = False
        if self._stopping is not None and self._stopping.done():
            answer, self._stopping = bool(self._stopping.result()), None
        if self._stopping is None and self.thread is not None:
            self._stopping = self.thread.submit(self._call, "stopping", None)
        return answer

    def stop(self, completed: bool) -> None:
        if self.thread is not None:  # the controller
            assert self.link is not None
            self.thread.submit(self.link.send, "stop", {"completed": completed}).result()
            self.thread.shutdown()

    def _call(self, command: str, payload: Any) -> Any:
        assert self.link is not None
        return self.link.call(command, payload)

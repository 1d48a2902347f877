"""Each role's own torch.distributed world, and the controller's links to the roles.

A job whose critic (or reference, or reward model) has ranks of its own runs one world per role:
the actor's ranks [0, A) form one, the critic's [A, A + C) another, and so on. Inside a role's
world, Megatron and vLLM find the default group they assume (megatron-core's optimizer gathers
over the default group, vLLM builds its groups over it), so a role's layout is just Megatron's
layout over its world. The controller (global rank 0) reaches a role through a link: a gloo group
of its own, outside the default world, over the controller and the role's ranks, that carries
pickled commands and replies.

Every world and link meets at one TCPStore that global rank 0 hosts at MASTER_PORT, under a prefix
per world and link, so a pod needs only MASTER_ADDR and MASTER_PORT, as with torchrun.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..config.topology import EngineConfig
from .world import RankEnv

log = logging.getLogger("kuberl.engine")


@dataclass(frozen=True)
class Block:
    """A role's own ranks (global) and its training layout."""

    role: str
    offset: int
    size: int
    tp: int
    pp: int
    ep: int = 1
    """Expert parallelism (a mixture of experts), inside the data-parallel ranks."""

    def __contains__(self, rank: int) -> bool:
        return self.offset <= rank < self.offset + self.size


def blocks(config: EngineConfig) -> list[Block]:
    """Every role with ranks of its own, in rank order (pure); checked to tile the world, actor first."""
    found = [
        Block(name, topo.rank_offset, topo.ranks, topo.layout.tp, topo.layout.pp, topo.layout.expert_parallel)
        for name, topo in config.own_rank_roles()
    ]
    if not found or found[0].role != "actor" or found[0].offset != 0:
        raise ValueError("roles.actor: the actor must have ranks of its own, starting at rank 0 (the controller)")
    expected = 0
    for block in found:
        if block.offset != expected:
            raise ValueError(
                f"roles.{block.role}: its ranks start at {block.offset}, expected {expected} "
                "(roles with ranks of their own sit side by side, actor first)"
            )
        if block.size % (block.tp * block.pp):
            raise ValueError(f"roles.{block.role}.layout: tp*pp = {block.tp * block.pp} does not divide its {block.size} ranks")
        expected += block.size
    if expected != config.world_size:
        raise ValueError(f"worldSize is {config.world_size}, but the roles' own ranks add up to {expected}")
    return found


class ObjectLink:
    """A gloo group outside the default world that broadcasts Python objects (pickled)."""

    def __init__(self, store: dist.Store, name: str, rank: int, size: int, timeout: timedelta):
        self.rank, self.size = rank, size
        self.group: dist.ProcessGroupGloo | None = dist.ProcessGroupGloo(dist.PrefixStore(f"link/{name}", store), rank, size, timeout)

    def broadcast_tensor(self, tensor: torch.Tensor, root: int) -> None:
        """`tensor` from the link's rank `root` into every other rank's `tensor` (same shape and dtype)."""
        if self.group is None:
            raise RuntimeError("this link is closed")
        options = dist.BroadcastOptions()
        options.rootRank = root
        self.group.broadcast([tensor], options).wait()  # type: ignore[attr-defined]  # torch's stub omits ProcessGroupGloo.broadcast

    def broadcast(self, obj: Any, root: int) -> Any:
        if self.rank == root:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            length = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        self.broadcast_tensor(length, root)
        if self.rank != root:
            data = torch.empty(int(length.item()), dtype=torch.uint8)
        self.broadcast_tensor(data, root)
        return obj if self.rank == root else pickle.loads(data.numpy().tobytes())

    def close(self) -> None:
        """Shut the group down now, while the interpreter is whole: a gloo group left to the exit's
        teardown can abort the process ("terminate called without an active exception")."""
        group, self.group = self.group, None
        if group is not None:
            group.shutdown()


@dataclass
class RoleWorld:
    """This rank's role, every role's block, and the links this rank is part of."""

    role: str
    block: Block
    blocks: list[Block]
    global_rank: int
    links: dict[str, ObjectLink] = field(default_factory=dict)

    def remote_roles(self) -> list[str]:
        return [b.role for b in self.blocks[1:]]


def leave(world: RoleWorld) -> None:
    """End this rank's part in the job's groups once no collective is left (after the last barrier):
    the links, Megatron's model-parallel groups, then the role's world."""
    for link in world.links.values():
        link.close()
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def wait_until_resolvable(host: str, timeout_s: float, poll_s: float = 0.5) -> None:
    """In a cluster, rank 0's name (its pod under the job's headless Service) resolves only once that
    pod has an address, which may be after this pod starts: wait for it instead of failing."""
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except socket.gaierror as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"MASTER_ADDR {host} did not resolve within {timeout_s:.0f} s: {exc}") from exc
            time.sleep(poll_s)


def join(env: RankEnv, config: EngineConfig) -> RoleWorld:
    """Join this rank's role world (NCCL between GPUs, gloo on CPU) and its links.

    Every collective gives up after env.timeout_s (KUBERL_TIMEOUT_S) and every link after
    env.link_timeout_s (KUBERL_LINK_TIMEOUT_S), so a rank that hangs ends the run with an error
    instead of a wait without end."""
    found = blocks(config)
    block = next(b for b in found if env.rank in b)
    timeout = timedelta(seconds=env.timeout_s)
    if env.rank != 0:
        wait_until_resolvable(env.master_addr, env.timeout_s)
    store = dist.TCPStore(env.master_addr, env.master_port, is_master=env.rank == 0, wait_for_workers=False, timeout=timeout)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group(
        backend, store=dist.PrefixStore(f"world/{block.role}", store), rank=env.rank - block.offset, world_size=block.size, timeout=timeout
    )
    world = RoleWorld(block.role, block, found, env.rank)
    # A role waits on its link for the next command while the actor generates and trains: up to a
    # whole step. A rank that dies closes its connections, which ends a wait at once.
    link_timeout = timedelta(seconds=max(env.timeout_s, env.link_timeout_s))
    for other in found[1:]:  # link ranks: the controller is 0, the role's ranks 1..size
        if env.rank == 0:
            world.links[other.role] = ObjectLink(store, other.role, 0, other.size + 1, link_timeout)
        elif env.rank in other:
            world.links[other.role] = ObjectLink(store, other.role, env.rank - other.offset + 1, other.size + 1, link_timeout)
    log.info(
        "rank %d of %d joined role %s (rank %d of %d there, %s, %s:%d)",
        env.rank,
        env.world_size,
        block.role,
        env.rank - block.offset,
        block.size,
        backend,
        env.master_addr,
        env.master_port,
    )
    return world

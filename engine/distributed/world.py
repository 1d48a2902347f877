"""One rank's place in the job's torch.distributed world, from the environment a pod (or `kuberl run`) gives it.

The environment is torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); in a pod of
an indexed Job, RANK is derived from the role's rank offset, the pod's completion index and the
process's local rank, so every pod of a role can share one template.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch.distributed as dist

from ..config.termination import NotRetryable

DEFAULT_TIMEOUT_S = 600
DEFAULT_LINK_TIMEOUT_S = 3600


class WorldError(NotRetryable, RuntimeError):
    """The environment does not describe a valid rank."""

    reason = "InvalidConfig"


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    role: str
    timeout_s: int
    link_timeout_s: int = DEFAULT_LINK_TIMEOUT_S
    """How long a role on ranks of its own waits for the controller's next command: a whole step."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "RankEnv":
        def integer(name: str, default: int | None = None) -> int:
            raw = environ.get(name)
            if raw is None:
                if default is None:
                    raise WorldError(f"environment variable {name} is not set")
                return default
            try:
                return int(raw)
            except ValueError:
                raise WorldError(f"environment variable {name}={raw!r} is not an integer") from None

        local_rank = integer("LOCAL_RANK", 0)
        if "RANK" in environ:
            rank = integer("RANK")
        else:  # a pod of an indexed Job
            rank = (
                integer("KUBERL_ROLE_RANK_OFFSET", 0) + integer("JOB_COMPLETION_INDEX", 0) * integer("KUBERL_PROCS_PER_POD", 1) + local_rank
            )
        world = integer("WORLD_SIZE", 1)
        if not 0 <= rank < world:
            raise WorldError(f"rank {rank} is outside the world of {world} ranks")
        return cls(
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=integer("MASTER_PORT", 29500),
            role=environ.get("KUBERL_ROLE", "actor"),
            timeout_s=integer("KUBERL_TIMEOUT_S", DEFAULT_TIMEOUT_S),
            link_timeout_s=integer("KUBERL_LINK_TIMEOUT_S", DEFAULT_LINK_TIMEOUT_S),
        )


def init_model_parallel(tp: int, pp: int, seed: int, ep: int = 1) -> None:
    """megatron-core's process groups for (tp, pp) over this rank's world (dp is what remains), and for a
    mixture of experts' `ep` expert-parallel ranks, which megatron-core takes out of the data-parallel ones."""
    from ..compat import megatron_cpu

    megatron_cpu.apply()
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    world = dist.get_world_size()
    if world % (tp * pp):
        raise WorldError(f"tp*pp = {tp * pp} does not divide the world of {world} ranks")
    if (world // (tp * pp)) % ep:
        raise WorldError(f"ep = {ep} does not divide the {world // (tp * pp)} data-parallel ranks")
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep)
    model_parallel_cuda_manual_seed(seed)


def model_parallel_ranks() -> dict[tuple[int, int], int]:
    """(pipeline stage, TP rank) -> global rank, for this rank's model-parallel group."""
    from megatron.core import parallel_state as ps

    group = ps.get_model_parallel_group()
    members: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(
        members, (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(), dist.get_rank()), group=group
    )
    return {(s, t): r for s, t, r in members}


def expert_parallel_ranks() -> dict[tuple[int, int], int]:
    """(pipeline stage, ep rank) -> global rank, for this rank's expert-tensor-model-pipeline group (tp is 1 under a
    mixture of experts): the ranks that hold the experts this rank's switch gathers."""
    from megatron.core import parallel_state as ps

    group = ps.get_expert_tensor_model_pipeline_parallel_group()
    members: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(
        members, (ps.get_pipeline_model_parallel_rank(), ps.get_expert_model_parallel_rank(), dist.get_rank()), group=group
    )
    return {(s, e): r for s, e, r in members}

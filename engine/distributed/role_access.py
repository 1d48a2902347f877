"""How the actor's ranks reach the reference and the critic, colocated or on ranks of their own.

A colocated role is a further Megatron model on the actor's ranks; a role on ranks of its own is
asked over its link by the controller, and every actor rank gets the reply (role_link.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..training.policy import MegatronLM
from .role_link import RoleLink
from ..training.sequences import SeqBatch


class RoleAccess:
    def __init__(self, links: dict[str, RoleLink], remote_roles: set[str], is_controller: bool, world: int, micro_batch_size: int):
        self.links, self.remote_roles = links, remote_roles
        self.is_controller, self.world, self.micro_batch_size = is_controller, world, micro_batch_size

    def ask(self, role: str, command: str, payload: Any) -> None:
        """Send a role on ranks of its own a command (controller; nothing for colocated roles)."""
        if role in self.links:
            self.links[role].send(command, payload)

    def answer(self, role: str) -> Any:
        """The role's reply to the oldest pending command, on every actor rank."""
        holder = [self.links[role].result() if self.is_controller else None]
        if self.world > 1:
            dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def rows(self, role: str, model: MegatronLM | None, batch: SeqBatch) -> torch.Tensor:
        """Log-probs (reference) or values (critic) of every row, from the colocated model or the role's ranks."""
        if role in self.remote_roles:
            return self.answer(role)
        assert model is not None
        compute = model.response_values if model.value_head else model.response_logprobs
        return model.rows_over_dp(compute, batch, self.micro_batch_size)

"""Roles on ranks of their own: the controller's link to a role, and the loop a role's ranks run.

The controller (global rank 0, an actor rank) sends a command and its payload to every rank of the
role; the role's ranks compute together in their own world (SPMD, split over the role's DP ranks)
and the role's first rank replies. Both directions are broadcasts over the role's link
(role_worlds.py). The controller may send to several roles before it collects any reply, so a
critic's values or update run while the reference computes, or while the actor trains.

Commands: "logprobs" (reference), "values" and "train" (critic), "score" (reward model), "save"
(each rank writes its part of the step's checkpoint), "stopping" (was a rank of the role signalled to
stop? asked at every step boundary, stopping.py), "stop". Every command but "stop" is answered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..config.topology import EngineConfig
from . import checkpoint as ckpt
from .role_worlds import ObjectLink, RoleWorld
from .stopping import StopRequest, agree
from .update_stats import mean_of, mean_over

log = logging.getLogger("kuberl.engine")


class RoleLink:
    """The line between the controller and one role's ranks."""

    # On the link, the controller is rank 0 and the role's first rank is rank 1.
    CONTROLLER, ROLE = 0, 1

    def __init__(self, role: str, link: ObjectLink):
        self.role, self.link = role, link
        self.pending = 0

    # controller side
    def send(self, command: str, payload: Any = None) -> None:
        self.link.broadcast((command, payload), root=self.CONTROLLER)
        if command != "stop":
            self.pending += 1

    def result(self) -> Any:
        """The reply to the oldest command still unanswered."""
        assert self.pending > 0, f"no command to {self.role} is waiting for its reply"
        self.pending -= 1
        reply = self.link.broadcast(None, root=self.ROLE)
        if isinstance(reply, RoleFailure):
            raise RuntimeError(f"role {self.role}: {reply.message}")
        return reply

    def call(self, command: str, payload: Any = None) -> Any:
        self.send(command, payload)
        return self.result()

    # role side
    def receive(self) -> tuple[str, Any]:
        return self.link.broadcast(None, root=self.CONTROLLER)

    def reply(self, value: Any) -> None:
        self.link.broadcast(value, root=self.ROLE)


@dataclass(frozen=True)
class RoleFailure:
    """What a role replies when a command failed on its first rank (the controller raises it)."""

    message: str


def checkpoint_root(config: EngineConfig, base_dir: Path) -> Path:
    root = Path(config.trainer.checkpoint.path).expanduser()
    return root if root.is_absolute() else base_dir / root


def policy_temperature(config: EngineConfig) -> float:
    """What the actor's and the reference's logits are divided by (RolloutSpec.training_temperature);
    1 for a job that samples nothing (DPO learns from given pairs)."""
    if config.rollout is None or not config.algorithm.on_policy:
        return 1.0
    return config.rollout.training_temperature


class RoleWorker:
    """What the ranks of a reference, critic or reward-model role run: commands until "stop"."""

    def __init__(self, config: EngineConfig, world: RoleWorld, base_dir: Path = Path(".")):
        self.config, self.world, self.role = config, world, world.role
        self.link = RoleLink(self.role, world.links[self.role])
        self.micro_batch_size = config.trainer.micro_batch_size
        self.model = self.reward_model = None
        self.checkpoints = checkpoint_root(config, base_dir)
        if self.role == "reward":
            from ..rewards import RewardModel

            assert config.reward is not None and config.reward.model is not None
            self.reward_model = RewardModel(config.reward.model, base_dir)
        else:
            from ..models.arch import LlamaArch
            from ..models.loading import read_hf_config, read_hf_state_dict
            from .policy import MegatronLM
            from .resolve import model_folder
            from ..dtypes import torch_dtype

            folder = model_folder(config.model, base_dir)
            arch = LlamaArch.from_hf_config(read_hf_config(folder))
            critic = self.role == "critic"
            from .packing import layout_options

            self.model = MegatronLM(arch, read_hf_state_dict(folder), dtype=torch_dtype(config.model.dtype),
                                    optimizer=config.trainer.optimizer if critic else None, value_head=critic,
                                    logit_temperature=policy_temperature(config), **layout_options(config.trainer))
            if critic:
                from .losses import value_loss_fn

                self.value_loss = value_loss_fn(config.algorithm)
                self._resume()
        block = world.block
        log.info("role %s ready on ranks %d..%d", self.role, block.offset, block.offset + block.size - 1)

    def _resume(self) -> None:
        steps = ckpt.complete_steps(self.checkpoints)
        if steps:
            state = ckpt.load(self.checkpoints, steps[-1], self.world.global_rank, self.config.world_size)
            self.model.load_state_dict(state[self.role])

    def serve(self, stop: StopRequest | None = None) -> bool:
        """Answer commands until "stop"; True when the job completed, False when it stopped early."""
        self.stop = stop or StopRequest()
        while True:
            command, payload = self.link.receive()
            if command == "stop":
                return bool((payload or {}).get("completed", True))
            try:
                result = getattr(self, f"_{command}")(payload)
            except Exception as exc:
                # The controller raises it with the role named; this rank then ends like any failed rank.
                self.link.reply(RoleFailure(f"{command} failed: {type(exc).__name__}: {exc}"))
                raise
            self.link.reply(result)

    def _stopping(self, payload: None) -> bool:
        """Whether any rank of this role was signalled (the controller asks at every step boundary)."""
        return agree(self.stop.requested)

    def _save(self, payload: dict[str, Any]) -> str:
        state: dict[str, Any] = {"role": self.role}
        if self.model is not None and self.model.trainable:
            state[self.role] = self.model.state_dict()
        ckpt.write_part(self.checkpoints, payload["step"], self.world.global_rank, state)
        dist.barrier()  # the reply means: every rank of the role has written its part
        return "written"

    def _logprobs(self, batch) -> torch.Tensor:
        return self.model.rows_over_dp(self.model.response_logprobs, batch, self.micro_batch_size)

    def _values(self, batch) -> torch.Tensor:
        return self.model.rows_over_dp(self.model.response_values, batch, self.micro_batch_size)

    def _train(self, payload: dict[str, Any]) -> dict[str, float]:
        return mean_over(mean_of(self.model.train_plan(payload["batch"], payload["plan"], self.value_loss, self.micro_batch_size)))

    def _score(self, payload: dict[str, Any]) -> list[float]:
        from .sequences import shard_rows

        prompts, responses = payload["prompts"], payload["responses"]
        mine = shard_rows(len(prompts), dist.get_rank(), dist.get_world_size())
        local = self.reward_model.score_batch([prompts[i] for i in mine], [responses[i] for i in mine])
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        return [score for part in gathered for score in part]


class RemoteRewardModel:
    """The controller's stand-in for a reward model on ranks of its own (what the Rewarder calls)."""

    def __init__(self, link: RoleLink):
        self.link = link

    def score_batch(self, prompts, responses) -> list[float]:
        return self.link.call("score", {"prompts": list(prompts), "responses": list(responses)})

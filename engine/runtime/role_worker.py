"""What the ranks of a role on ranks of its own run: commands from the controller, until "stop".

The role's ranks compute together in their own world (SPMD, split over the role's DP ranks) and the
role's first rank replies over the link (distributed/role_link.py). Commands: "logprobs" (reference),
"values" and "train" (critic), "score" (reward model), "save" (each rank writes its part of the
step's checkpoint), "stopping" (was a rank of the role signalled to stop? asked at every step
boundary, stopping.py), "stop". Every command but "stop" is answered.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..config.topology import EngineConfig
from ..distributed.role_link import RoleLink, serve_commands
from ..distributed.role_worlds import RoleWorld
from ..models.loading import read_hf_state_dict
from ..rewards import RewardModel
from ..training.losses import value_loss_fn
from ..training.update_stats import mean_of, mean_over
from . import checkpoint as ckpt
from .builders import build_critic, build_reference, model_files
from .checkpoint import checkpoint_root
from .stopping import StopRequest, agree

log = logging.getLogger("kuberl.engine")


class RoleWorker:
    """What the ranks of a reference, critic or reward-model role run: commands until "stop"."""

    def __init__(self, config: EngineConfig, world: RoleWorld, base_dir: Path = Path(".")):
        self.config, self.world, self.role = config, world, world.role
        self.link = RoleLink(self.role, world.links[self.role])
        self.micro_batch_size = config.trainer.micro_batch_size
        self.model = self.reward_model = None
        self.checkpoints = checkpoint_root(config, base_dir)
        if self.role == "reward":
            assert config.reward is not None and config.reward.model is not None
            self.reward_model = RewardModel(config.reward.model, base_dir)
        else:
            # The same builders as a colocated role's (builders.py): the same model wherever it runs.
            files = model_files(config, base_dir)
            hf_state = read_hf_state_dict(files.folder)
            critic = self.role == "critic"
            self.model = build_critic(config, files, hf_state) if critic else build_reference(config, files, hf_state)
            del hf_state
            if critic:
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
        self.stop.steps_begin()
        return serve_commands(self.link, self)

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
        from ..training.sequences import shard_rows

        prompts, responses = payload["prompts"], payload["responses"]
        mine = shard_rows(len(prompts), dist.get_rank(), dist.get_world_size())
        local = self.reward_model.score_batch([prompts[i] for i in mine], [responses[i] for i in mine])
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        return [score for part in gathered for score in part]

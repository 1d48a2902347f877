"""The RL loop of one job, as every rank runs it.

All ranks run this same program (SPMD); rank 0 is the controller: it scores responses, logs,
serves metrics and writes progress. One step follows the data flow docs/architecture.md draws:

    switch weights into vLLM -> generate (prompts split over the actor's ranks) -> gather
    -> rewards (controller, broadcast) -> reference log-probs, critic values (split over DP)
    -> advantages (pure, same on every rank) -> updates of actor and critic (split over DP)
    -> metrics, checkpoint

This module composes a run (models, rollout engine, data, checkpoints) and runs the loop. What one
step does is a step function over a StepContext (engine/steps/); the switch between training and
generation is rollout/switch.py, generation over the replicas rollout/generation.py, the roles' answers
distributed/role_access.py, and what the engine refuses up front checks.py.

A colocated role runs on the actor's ranks: the reference policy and the critic are further
Megatron models in the actor's layout, and a reward model runs on the controller. A role on ranks of
its own runs `role_worker.RoleWorker` in a torch.distributed world of its own; the controller sends it
commands over its link and every actor rank gets the replies (distributed/role_link.py, role_worlds.py). The
default group here is the actor's world.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import algorithms as A
from ..config.algorithm import AlgorithmSpec
from ..config.progress import CheckpointStatus
from ..config.topology import EngineConfig
from ..data import PromptEncoder, PromptLoader, load_examples
from ..common.dtypes import is_half, torch_dtype, vllm_dtype
from ..models.arch import LlamaArch
from ..models.loading import export_hf_folder, read_hf_config, read_hf_state_dict
from ..models.lora_layout import adapter_config
from ..steps import step_entry
from ..steps.context import StepContext
from ..steps.records import Rollout, Scores
from . import checkpoint as ckpt
from . import multi_turn_run
from .checks import ConfigError, check_supported
from ..training.losses import policy_loss_fn, value_loss_fn
from .metrics import RunMetrics, plot_rewards, read_jsonl
from ..training.packing import layout_options
from ..training.lora import AdapterOff
from ..training.policy import MegatronLM
from . import lora_run
from ..models.resolve import model_folder
from ..distributed.role_access import RoleAccess
from ..distributed.role_worlds import RoleWorld
from ..distributed.role_link import RemoteRewardModel, RoleLink
from .checkpoint import checkpoint_root
from ..config.topology import policy_temperature
from .stopping import StopRequest, agree
from ..common.timer import Timer

__all__ = ["ConfigError", "RLRun", "Timer", "check_supported"]

log = logging.getLogger("kuberl.engine")


def recomputes_old_logprobs(algorithm: AlgorithmSpec, half: bool, truncated: bool) -> bool:
    """Whether the trainer recomputes the old policy's log-probs instead of taking vLLM's. vLLM's
    stand for them only where both compute alike: float32 (not `half`), and the full distribution
    (not `truncated` by top-p/top-k)."""
    if algorithm.old_logprobs != "auto":
        return algorithm.old_logprobs == "recompute"
    return half or truncated


class RLRun:
    """One rank's part of a job: models, rollout engine, data, and the step loop."""

    def __init__(self, config: EngineConfig, world: RoleWorld, run_dir: Path, base_dir: Path = Path(".")):
        """`config` has passed check_supported (the worker checks it before any rank joins)."""
        self.config, self.run_dir = config, run_dir
        # The default group is the actor's own world; its ranks come first in the job, so a rank
        # here is also the global rank.
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_controller = self.rank == 0
        self.remote_roles = set(world.remote_roles())
        self.links = {role: RoleLink(role, link) for role, link in world.links.items()} if self.is_controller else {}
        trainer, algorithm = config.trainer, config.algorithm
        self.dpo = not algorithm.on_policy

        folder = model_folder(config.model, base_dir)
        self.folder = folder
        self.hf_config = read_hf_config(folder)
        self.arch = LlamaArch.from_hf_config(self.hf_config)
        from transformers import AutoTokenizer

        tok_source = model_folder(config.tokenizer, base_dir) if config.tokenizer and config.tokenizer.source() else folder
        self.tokenizer = AutoTokenizer.from_pretrained(tok_source)
        if config.tokenizer and config.tokenizer.chat_template:
            self.tokenizer.chat_template = config.tokenizer.chat_template
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.dtype = torch_dtype(config.model.dtype)

        # Data before models: a bad record fails the run in seconds, not after the models load.
        # Every rank reads the same examples and walks the same seeded order.
        data = config.data
        # A multi-turn job's tools (and a chat template that describes them) before the prompts are rendered.
        self.agents = multi_turn_run.prepare_agents(config, self.tokenizer, base_dir)
        self.encoder = PromptEncoder(self.tokenizer, data, tools=self.agents.schemas if self.agents else None)
        self.train_examples = load_examples(data.train, data, base_dir, preferences=self.dpo)
        self.validation = load_examples(data.validation, data, base_dir) if data.validation and not self.dpo else []
        for example in self.train_examples + self.validation:
            self.encoder.encode(example)  # too long, or not renderable: refused now, with file:line
        self.loader = PromptLoader(self.train_examples, trainer.prompts_per_step, trainer.seed, data.shuffle)
        self.total_steps = trainer.total_steps or trainer.total_epochs * self.loader.steps_per_epoch

        hf_state = read_hf_state_dict(folder)
        layout = layout_options(trainer)
        temperature = policy_temperature(config)
        self.lora = trainer.lora
        self.actor = MegatronLM(self.arch, hf_state, dtype=self.dtype, optimizer=trainer.optimizer,
                                logit_temperature=temperature, lora=self.lora, lora_seed=trainer.seed, **layout)
        self.needs_ref = algorithm.needs_reference
        estimator = A.estimator_of(algorithm)
        self.needs_critic = estimator is not None and estimator.needs_critic
        # With LoRA the reference is the actor's own base: its adapter off, no second copy of the weights.
        self.ref = (AdapterOff(self.actor) if self.lora else MegatronLM(self.arch, hf_state, dtype=self.dtype,
                                                                         logit_temperature=temperature, **layout)) \
            if self.needs_ref and "ref" not in self.remote_roles else None
        self.critic = MegatronLM(self.arch, hf_state, dtype=self.dtype, optimizer=trainer.optimizer, value_head=True, **layout) \
            if self.needs_critic and "critic" not in self.remote_roles else None
        del hf_state
        self.dp_rank, self.dp_size = self.actor.place.dp_rank, self.actor.place.dp_size
        self.roles = RoleAccess(self.links, self.remote_roles, self.is_controller, self.world, trainer.micro_batch_size)
        self.use_algorithm(algorithm)

        self.rewarder = None
        if self.is_controller and config.reward is not None and not self.dpo:
            from ..rewards import Rewarder

            remote = RemoteRewardModel(self.links["reward"]) if "reward" in self.links else None
            self.rewarder = Rewarder(config.reward, base_dir, remote_model=remote)

        # vLLM replicas of rollout_tp consecutive ranks each (rollout_tp = 1: one per rank).
        self.rollout_tp = config.roles["actor"].rollout_tp
        self.rollout = self.resharder = self.generator = self.switch = self.multi_turn = None
        if not self.dpo:
            from ..rollout.vllm_backend import VLLMRollout

            from ..rollout.generation import Generator
            from ..rollout.switch import HybridSwitch

            spec = config.rollout
            assert spec is not None
            self.resharder = self._make_resharder(self.rollout_tp)  # refuses a layout it cannot serve before vLLM starts
            self.rollout = VLLMRollout(folder, dtype=vllm_dtype(self.dtype), seed=trainer.seed + self.rank // self.rollout_tp,
                                       max_model_len=data.max_prompt_length + spec.max_response_tokens,
                                       kv_cache_bytes=spec.kv_cache_bytes, gpu_memory_utilization=spec.gpu_memory_utilization,
                                       tensor_parallel_size=self.rollout_tp, skip_tokenizer_init=True,
                                       lora_rank=self.lora.rank if self.lora else None)
            self.generator = Generator(self.rollout, self.rank, self.world, self.rollout_tp)
            if self.agents is not None:
                self.multi_turn = multi_turn_run.multi_turn_rollout(self.agents, self.generator, self.encoder, config, self.stop_ids())
            adapter = lora_run.adapter_gather(self.arch, self.lora, self.actor.place) if self.lora else None
            self.switch = HybridSwitch(self.actor, self.critic, self.rollout, self.resharder, adapter,
                                       adapter_config(self.lora, str(folder)) if self.lora else None)

        self.metrics = RunMetrics(config.job, config.metrics_port, run_dir / "metrics.jsonl") if self.is_controller else None
        self.checkpoints = checkpoint_root(config, base_dir)
        self.step = 0
        self.updates = 0
        self.reshard_total = {"seconds": 0.0, "step_seconds": 0.0}
        self.stopped = False
        """run() ended early on a stop request (its last step is checkpointed)."""
        self.last_checkpoint: CheckpointStatus | None = None
        """The newest complete checkpoint (controller rank): what the progress report names."""
        self._resume()
        self.trackers = None
        if self.is_controller and config.tracking:
            from ..tracking import Trackers, flat_params

            # After the resume: a resumed job continues its runs, from the step after its checkpoint.
            self.trackers = Trackers(config.tracking, job=config.job, run_dir=run_dir, ids_dir=self.checkpoints,
                                     params=flat_params(config.to_manifest()), resumed_at=self.step)

    # -- lifecycle --------------------------------------------------------------------------------

    def _resume(self) -> None:
        steps = ckpt.complete_steps(self.checkpoints)
        if not steps:
            return
        if self.lora:
            lora_run.check_base(ckpt.step_dir(self.checkpoints, steps[-1]), self.folder, self.hf_config, self.lora)
        state = ckpt.load(self.checkpoints, steps[-1], self.rank, self.config.world_size)
        self.actor.load_state_dict(state["actor"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.loader.load_state_dict(state["loader"])
        self.step, self.updates = state["step"], state["updates"]
        ckpt.set_rng_state(state["rng"])
        if self.is_controller:
            self.last_checkpoint = ckpt.status(self.checkpoints, self.step)
            log.info("resumed from %s (step %d)", ckpt.step_dir(self.checkpoints, self.step), self.step)

    def save(self) -> Path:
        """Every rank of the job writes its part, roles on ranks of their own too; the controller commits."""
        state = {"actor": self.actor.state_dict(), "loader": self.loader.state_dict(), "step": self.step,
                 "updates": self.updates, "rng": ckpt.rng_state()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        if self.is_controller:
            ckpt.prepare(self.checkpoints, self.step)
        dist.barrier()
        for link in self.links.values():
            link.send("save", {"step": self.step})
        ckpt.write_part(self.checkpoints, self.step, self.rank, state)
        dist.barrier()
        if self.is_controller:
            for link in self.links.values():
                link.result()
            ckpt.commit(self.checkpoints, self.step, self.config.world_size, keep=self.config.trainer.checkpoint.keep,
                        meta={"job": self.config.job, "algorithm": self.config.algorithm.name,
                              **(lora_run.base_reference(self.folder, self.hf_config, self.lora) if self.lora else {})})
            self.last_checkpoint = ckpt.status(self.checkpoints, self.step)
        dist.barrier()
        return ckpt.step_dir(self.checkpoints, self.step)

    def run(self, progress=None, stop: StopRequest | None = None) -> dict[str, Any]:
        """Train to the last step, or until `stop` is requested on any rank of the job (then with a
        checkpoint of the step that was running, and `self.stopped` set); returns the controller's
        last record (empty on other ranks)."""
        trainer = self.config.trainer
        last: dict[str, Any] = {}
        if stop is not None:
            stop.steps_begin()
        if self.step == 0 and self.validation and trainer.validation_interval:
            last = {"step": 0, **self._validate()}
            self._publish(last)
        while self.step < self.total_steps:
            timer = Timer()
            record = self.run_step(timer)
            self.step += 1
            if self.validation and trainer.validation_interval and (self.step % trainer.validation_interval == 0 or self.step == self.total_steps):
                with timer("validation"):
                    record.update(self._validate())
            stopping = stop is not None and self._stop_agreed(stop) and self.step < self.total_steps
            if stopping or self.step % trainer.checkpoint.interval == 0 or self.step == self.total_steps:
                with timer("checkpoint"):
                    folder = self.save()
                record["checkpoint"] = str(folder)
            record["step"] = self.step
            record["phase_seconds"] = dict(timer.seconds)
            record["step_seconds"] = sum(timer.seconds.values())
            # The switch's share of the step: streaming into vLLM plus the part of the switch back that was not hidden.
            exposed = timer.seconds.get("reshard", 0.0) + timer.seconds.get("switch_back", 0.0)
            self.reshard_total["seconds"] += exposed
            self.reshard_total["step_seconds"] += record["step_seconds"]
            record["reshard_share"] = exposed / max(record["step_seconds"], 1e-9)
            self._publish(record)
            if progress is not None and self.is_controller:
                progress(record)
            last = record
            if stopping:
                self.stopped = True
                if self.is_controller:
                    log.info("stopped after step %d on request; resume continues from %s", self.step, record["checkpoint"])
                for link in self.links.values():
                    link.send("stop", {"completed": False})
                return last
        if trainer.export_path:
            self.export(Path(trainer.export_path).expanduser())
        if self.is_controller and self.metrics is not None and self.metrics.jsonl and self.metrics.jsonl.exists():
            plot_rewards(read_jsonl(self.metrics.jsonl), self.run_dir / "reward_curve.png", f"{self.config.job} ({self.config.algorithm.name})")
            if self.trackers is not None:
                self.trackers.artifact(self.run_dir / "reward_curve.png")
        for link in self.links.values():
            link.send("stop", {"completed": True})
        return last

    def _stop_agreed(self, stop: StopRequest) -> bool:
        """Whether any rank of the job, roles on ranks of their own included, was asked to stop."""
        wanted = stop.requested
        if self.is_controller:
            for link in self.links.values():
                wanted = link.call("stopping") or wanted
        return agree(wanted)

    def _publish(self, record: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.record(record)
        if self.trackers is not None:
            self.trackers.log(record)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.trackers is not None:
            self.trackers.close()

    # -- one step -----------------------------------------------------------------------------------

    def use_algorithm(self, algorithm: AlgorithmSpec) -> None:
        """What the steps run from now on: step function, estimator, losses, old log-probs. The models
        stay: the new algorithm must need the same ones (a reference, a critic, a rollout) as the job's."""
        choice = A.choice_of(algorithm)
        entry, estimator = step_entry(choice.step), A.estimator_of(algorithm)
        needs = (algorithm.needs_reference, estimator is not None and estimator.needs_critic, not entry.on_policy)
        if needs != (self.needs_ref, self.needs_critic, self.dpo):
            raise ConfigError(f"algorithm: {algorithm.name} needs other models than this run has")
        self.config = self.config.model_copy(update={"algorithm": algorithm})
        self.choice, self.step_fn, self.estimator = choice, entry.fn, estimator
        self.recompute_old_logprobs = not self.dpo and recomputes_old_logprobs(
            algorithm, is_half(self.dtype), self.config.rollout is not None and self.config.rollout.truncates)
        horizon = self.config.rollout.max_response_tokens if self.config.rollout is not None else 1
        self.policy_loss = policy_loss_fn(algorithm, horizon)
        self.value_loss = value_loss_fn(algorithm)

    def run_step(self, timer: Timer) -> dict[str, Any]:
        """The job's step function over a fresh StepContext; returns its record."""
        ctx = StepContext(self, timer, self.choice)
        self.step_fn(ctx)
        return ctx.record.as_dict()

    def score(self, rollout: Rollout) -> Scores:
        """The reward of every completion, computed on the controller and broadcast to every rank."""
        holder: list[Any] = [None]
        if self.is_controller:
            completions = rollout.completions
            texts = self.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
            prompts = [self.encoder.text(rollout.examples[c.prompt_index]) for c in completions]
            answers = [rollout.examples[c.prompt_index].answer for c in completions]
            texts, messages = multi_turn_run.reward_inputs(completions, texts)  # multi-turn: last turns, conversations
            holder[0] = multi_turn_run.with_environment(self.rewarder.score_sources(prompts, texts, answers, messages), completions)
        dist.broadcast_object_list(holder, src=0)
        scored = holder[0]
        return Scores(torch.tensor(scored.totals, dtype=torch.float32), scored.means,
                      {k: torch.tensor(v, dtype=torch.float32) for k, v in scored.sources.items()}, scored.weights)

    # -- validation and export -----------------------------------------------------------------------

    def _validate(self) -> dict[str, float]:
        ctx = StepContext(self, Timer(), self.choice)
        rollout = ctx.generate(self.validation, ctx.sampling(greedy=True))
        return {"validation_reward_mean": float(ctx.score(rollout).values.mean())}

    def export(self, out: Path) -> None:
        """Write the current policy as a Hugging Face folder (controller rank); with LoRA, the adapter."""
        if self.lora:
            return lora_run.export(lora_run.adapter_gather(self.arch, self.lora, self.actor.place), self.actor.adapters.state(),
                                   self.lora, self.folder, self.hf_config, out, self.is_controller)
        # The switch's gather with t_g = 1 gives every rank of a model-parallel group the full model.
        resharder = self.resharder if self.resharder is not None and self.rollout_tp == 1 else self._make_resharder(1)
        full = dict(resharder.stream(self.actor.megatron_state()))
        if self.is_controller:
            export_hf_folder(full, self.hf_config, out, tokenizer_from=self.folder)
            log.info("exported the policy to %s", out)
        dist.barrier()

    def _make_resharder(self, tg: int):
        """The training->generation switch for this rank's place in the actor's layout, for vLLM
        replicas of `tg` ranks."""
        from megatron.core import parallel_state as ps

        from ..hybrid.reshard import Resharder
        from ..distributed.world import model_parallel_ranks

        place = self.actor.place
        try:
            return Resharder(self.arch, place.tp, place.pp, place.pp_rank, place.tp_rank, model_parallel_ranks(),
                             ps.get_model_parallel_group(), dtype=self.dtype, tg=tg)
        except ValueError as exc:
            raise ConfigError(f"roles.actor.layout.rolloutTp: {exc}") from None

    # -- helpers --------------------------------------------------------------------------------------

    def stop_ids(self) -> tuple[int, ...]:
        ids = {self.tokenizer.eos_token_id}
        if self.tokenizer.pad_token_id is not None:
            ids.add(self.tokenizer.pad_token_id)
        return tuple(sorted(i for i in ids if i is not None))

    def total_updates(self) -> int:
        """Optimizer updates of the whole run (the learning-rate schedule's length)."""
        trainer, algorithm = self.config.trainer, self.config.algorithm
        # A preset that trains on pairs counts pairs; one that generates, every sample of a prompt.
        samples = self.config.rollout.samples_per_prompt if self.config.rollout is not None and not self.dpo else 1
        per_step = trainer.prompts_per_step * samples
        minis = math.ceil(per_step / (trainer.mini_batch_size or per_step))
        return self.total_steps * minis * algorithm.update_epochs

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
from ..common.dtypes import is_half
from ..common.timer import Timer
from ..config.algorithm import AlgorithmSpec
from ..config.progress import CheckpointStatus
from ..config.topology import EngineConfig, max_staleness, separate_rollout
from ..data import PromptEncoder, PromptLoader, load_examples
from ..distributed.role_access import RoleAccess
from ..distributed.role_link import RoleLink
from ..distributed.role_worlds import RoleWorld
from ..distributed.rollout_fleet import AdapterSource, RolloutFleet
from ..models.lora_layout import adapter_config
from ..models.loading import export_hf_folder, read_hf_state_dict
from ..rollout.fleet_load import trainer_idle_fraction
from ..steps import step_entry
from ..steps.async_rollout import GenerationPipeline, InFlightRefused
from ..steps.context import StepContext
from ..steps.records import Rollout, Scores
from ..training.losses import policy_loss_fn, value_loss_fn
from . import checkpoint as ckpt
from . import lora_run, multi_turn_run
from .builders import (
    ModelFiles,
    build_actor,
    build_critic,
    build_reference,
    build_resharder,
    build_rewarder,
    build_rollout,
    build_tokenizer,
    build_trackers,
    model_files,
)
from .checkpoint import checkpoint_root
from .checks import ConfigError, check_supported
from .metrics import RunMetrics, plot_rewards, read_jsonl
from .stopping import StopRequest, agree

__all__ = ["ConfigError", "RLRun", "Timer", "check_supported"]

log = logging.getLogger("kuberl.engine")


def recomputes_old_logprobs(algorithm: AlgorithmSpec, half: bool, truncated: bool, stale: bool = False) -> bool:
    """Whether the trainer recomputes the old policy's log-probs instead of taking vLLM's. vLLM's
    stand for them only where both compute alike: float32 (not `half`), and the full distribution
    (not `truncated` by top-p/top-k), of the policy that trains (not `stale`: with algorithm.async the
    samples may come from older versions; vLLM's log-probs are then the behaviour policy's, which the
    rollout corrections, tis and the mismatch metrics, compare the recomputed ones with)."""
    if algorithm.old_logprobs != "auto":
        return algorithm.old_logprobs == "recompute"
    return half or truncated or stale


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
        # The rollout role's link is the fleet's alone: one thread of the controller keeps its order.
        rollout_link = self.links.pop("rollout", None)
        self.separate = separate_rollout(config)
        self.dpo = not config.algorithm.on_policy
        self.lora = config.trainer.lora
        self.rollout_tp = config.roles["actor"].rollout_tp

        files = model_files(config, base_dir)
        self.files, self.folder, self.hf_config, self.arch, self.dtype = files, files.folder, files.hf_config, files.arch, files.dtype
        self.tokenizer = build_tokenizer(config, files, base_dir)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        # Data before models: a bad record fails the run in seconds, not after the models load.
        self._load_data(config, base_dir)
        self._build_models(config, files)
        self.roles = RoleAccess(self.links, self.remote_roles, self.is_controller, self.world, config.trainer.micro_batch_size)
        self.use_algorithm(config.algorithm)
        self.rewarder = build_rewarder(config, base_dir, self.links) if self.is_controller else None
        parts = (
            None
            if self.dpo or self.separate
            else build_rollout(config, files, self.actor, self.critic, self.agents, self.encoder, self.stop_ids(), self.rank, self.world)
        )
        self.rollout, self.resharder, self.generator, self.switch, self.multi_turn = (
            (parts.rollout, parts.resharder, parts.generator, parts.switch, parts.multi_turn) if parts else (None,) * 5
        )
        self.fleet: RolloutFleet | None = None
        self.pipeline: GenerationPipeline | None = None
        if self.separate:  # roles.rollout generates; the whole model goes to it after every update
            self.resharder = build_resharder(files, self.actor.place, 1)
            self.fleet = RolloutFleet(rollout_link, self.resharder, self.actor, self.is_controller, self.world, self._adapter_source())
            fleet = config.roles["rollout"]
            self.fleet_ranks = range(fleet.rank_offset, fleet.rank_offset + fleet.ranks)
            self.pipeline = GenerationPipeline(self.fleet, max_staleness(config), self.total_steps)

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
        # After the resume: a resumed job continues its tracking runs, from the step after its checkpoint.
        self.trackers = build_trackers(config, run_dir, self.checkpoints, self.step) if self.is_controller else None

    def _load_data(self, config: EngineConfig, base_dir: Path) -> None:
        """The prompts, every one encoded now (too long, or not renderable: refused with file:line), and
        the seeded loader that every rank walks alike."""
        data, trainer = config.data, config.trainer
        # A multi-turn job's tools (and a chat template that describes them) before the prompts are rendered.
        self.agents = multi_turn_run.prepare_agents(config, self.tokenizer, base_dir)
        self.encoder = PromptEncoder(self.tokenizer, data, tools=self.agents.schemas if self.agents else None)
        self.train_examples = load_examples(data.train, data, base_dir, preferences=self.dpo)
        self.validation = load_examples(data.validation, data, base_dir) if data.validation and not self.dpo else []
        for example in self.train_examples + self.validation:
            self.encoder.encode(example)
        self.loader = PromptLoader(self.train_examples, trainer.prompts_per_step, trainer.seed, data.shuffle)
        self.total_steps = trainer.total_steps or trainer.total_epochs * self.loader.steps_per_epoch

    def _build_models(self, config: EngineConfig, files: ModelFiles) -> None:
        """The actor, and the reference and critic where the algorithm needs them and they run on these ranks."""
        algorithm = config.algorithm
        estimator = A.estimator_of(algorithm)
        self.needs_ref = algorithm.needs_reference
        self.needs_critic = estimator is not None and estimator.needs_critic
        hf_state = read_hf_state_dict(files.folder)
        self.actor = build_actor(config, files, hf_state)
        self.ref = build_reference(config, files, hf_state, self.actor) if self.needs_ref and "ref" not in self.remote_roles else None
        self.critic = build_critic(config, files, hf_state) if self.needs_critic and "critic" not in self.remote_roles else None
        del hf_state
        self.dp_rank, self.dp_size = self.actor.place.dp_rank, self.actor.place.dp_size

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
        if self.pipeline is not None and "in_flight" in state:  # kept by a checkpoint of separate placement
            try:
                self.pipeline.restore(state["in_flight"])
            except InFlightRefused as exc:
                raise ckpt.CheckpointError(f"checkpoint {ckpt.step_dir(self.checkpoints, steps[-1])} refused: {exc}") from None
        if self.is_controller:
            self.last_checkpoint = ckpt.status(self.checkpoints, self.step)
            log.info("resumed from %s (step %d)", ckpt.step_dir(self.checkpoints, self.step), self.step)

    def save(self) -> Path:
        """Every rank of the job writes its part, roles on ranks of their own too; the controller commits."""
        loader = self.loader.state_dict()
        in_flight = None
        if self.pipeline is not None:  # the batches on their way, waited for: a resumed run draws their prompts again
            in_flight = self.pipeline.in_flight()
            loader = self.pipeline.loader_state(self.step, loader)
        state = {
            "actor": self.actor.state_dict(),
            "loader": loader,
            "step": self.step,
            "updates": self.updates,
            "rng": ckpt.rng_state(),
            **({"in_flight": in_flight} if in_flight is not None else {}),
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        if self.is_controller:
            ckpt.prepare(self.checkpoints, self.step)
        dist.barrier()
        for link in self.links.values():
            link.send("save", {"step": self.step})
        ckpt.write_part(self.checkpoints, self.step, self.rank, state)
        if self.fleet is not None and self.is_controller:
            # The rollout ranks hold nothing to resume (their engines start from the model, weights
            # follow; what they were generating is in the actor's parts): the controller writes their parts.
            for rank in self.fleet_ranks:
                ckpt.write_part(self.checkpoints, self.step, rank, {"role": "rollout"})
        dist.barrier()
        if self.is_controller:
            for link in self.links.values():
                link.result()
            ckpt.commit(
                self.checkpoints,
                self.step,
                self.config.world_size,
                keep=self.config.trainer.checkpoint.keep,
                meta={
                    "job": self.config.job,
                    "algorithm": self.config.algorithm.name,
                    **(lora_run.base_reference(self.folder, self.hf_config, self.lora) if self.lora else {}),
                },
            )
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
            if (
                self.validation
                and trainer.validation_interval
                and (self.step % trainer.validation_interval == 0 or self.step == self.total_steps)
            ):
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
            if self.fleet is not None:  # what the trainers waited for the fleet's batches
                record["trainer_idle_fraction"] = trainer_idle_fraction(timer.seconds.get("rollout", 0.0), record["step_seconds"])
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
                if self.fleet is not None:
                    self.fleet.stop(completed=False)
                return last
        if trainer.export_path:
            self.export(Path(trainer.export_path).expanduser())
        if self.is_controller and self.metrics is not None and self.metrics.jsonl and self.metrics.jsonl.exists():
            plot_rewards(
                read_jsonl(self.metrics.jsonl), self.run_dir / "reward_curve.png", f"{self.config.job} ({self.config.algorithm.name})"
            )
            if self.trackers is not None:
                self.trackers.artifact(self.run_dir / "reward_curve.png")
        for link in self.links.values():
            link.send("stop", {"completed": True})
        if self.fleet is not None:
            self.fleet.stop(completed=True)
        return last

    def _adapter_source(self) -> AdapterSource | None:
        """With trainer.lora, what the fleet sends the rollout role instead of the whole model."""
        if self.lora is None:
            return None
        gather, adapters = lora_run.adapter_gather(self.arch, self.lora, self.actor.place), self.actor.adapters
        assert adapters is not None
        return AdapterSource(lambda: gather.gather(adapters.state()), adapter_config(self.lora, str(self.folder)))

    def _stop_agreed(self, stop: StopRequest) -> bool:
        """Whether any rank of the job, roles on ranks of their own included, was asked to stop."""
        wanted = stop.requested
        if self.is_controller:
            for link in self.links.values():
                wanted = link.call("stopping") or wanted
            if self.fleet is not None:
                wanted = self.fleet.stopping() or wanted
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
            algorithm,
            is_half(self.dtype),
            self.config.rollout is not None and self.config.rollout.truncates,
            stale=max_staleness(self.config) > 0,
        )
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
        return Scores(
            torch.tensor(scored.totals, dtype=torch.float32),
            scored.means,
            {k: torch.tensor(v, dtype=torch.float32) for k, v in scored.sources.items()},
            scored.weights,
        )

    # -- validation and export -----------------------------------------------------------------------

    def _validate(self) -> dict[str, float]:
        ctx = StepContext(self, Timer(), self.choice)
        rollout = ctx.generate(self.validation, ctx.sampling(greedy=True))
        return {"validation_reward_mean": float(ctx.score(rollout).values.mean())}

    def export(self, out: Path) -> None:
        """Write the current policy as a Hugging Face folder (controller rank); with LoRA, the adapter."""
        if self.lora:
            return lora_run.export(
                lora_run.adapter_gather(self.arch, self.lora, self.actor.place),
                self.actor.adapters.state(),
                self.lora,
                self.folder,
                self.hf_config,
                out,
                self.is_controller,
            )
        # The switch's gather with t_g = 1 gives every rank of a model-parallel group the full model.
        resharder = (
            self.resharder if self.resharder is not None and self.rollout_tp == 1 else build_resharder(self.files, self.actor.place, 1)
        )
        full = dict(resharder.stream(self.actor.megatron_state()))
        if self.is_controller:
            export_hf_folder(full, self.hf_config, out, tokenizer_from=self.folder)
            log.info("exported the policy to %s", out)
        dist.barrier()

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

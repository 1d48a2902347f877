"""The RL loop of one job, as every rank runs it.

All ranks run this same program (SPMD); rank 0 is the controller: it scores responses, logs,
serves metrics and writes progress. One step follows DESIGN.md's data flow:

    switch weights into vLLM -> generate (prompts split over the actor's ranks) -> gather
    -> rewards (controller, broadcast) -> reference log-probs, critic values (split over DP)
    -> advantages (pure, same on every rank) -> updates of actor and critic (split over DP)
    -> metrics, checkpoint

A colocated role runs on the actor's ranks: the reference policy and the critic are further
Megatron models in the actor's layout, and a reward model runs on the controller. A role on ranks of
its own runs `roles.RoleWorker` in a torch.distributed world of its own; the controller sends it
commands over its link and every actor rank gets the replies (roles.py, role_worlds.py). The
default group here is the actor's world. The controller asks the reference and the
critic before it waits for either, and the critic's update runs while the actor trains.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from .. import algorithms as A
from ..config.algorithm import DPOSpec
from ..config.progress import CheckpointStatus
from ..config.topology import EngineConfig
from ..data import Example, PromptEncoder, PromptLoader, load_examples
from ..models.arch import LlamaArch
from ..models.loading import export_hf_folder, read_hf_config, read_hf_state_dict
from . import checkpoint as ckpt
from .losses import policy_loss_fn, value_loss_fn
from .metrics import RunMetrics, plot_rewards, read_jsonl
from .overlap import Background
from .policy import MegatronLM, learning_rate, response_logprobs_from_logits
from .resolve import model_folder
from .role_worlds import RoleWorld
from .roles import RemoteRewardModel, RoleLink, checkpoint_root, mean_of, mean_over
from .sequences import SeqBatch, micro_batches, pack, shard_rows
from .stopping import StopRequest, agree

log = logging.getLogger("kuberl.engine")


class ConfigError(ValueError):
    """The job asks for something this engine cannot do; the message names the field."""


@dataclass
class Timer:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


def check_supported(config: EngineConfig) -> None:
    """What this engine runs today; refused up front with the field named. Loads the job's algorithm plug-ins."""
    from ..algorithms.plugins import load_plugins

    algorithm = config.algorithm
    load_plugins([Path(p.path).expanduser() for p in algorithm.plugins])
    choice = A.choice_of(algorithm)
    for field, name, entries in (("advantage", choice.advantage, A.ADVANTAGES), ("policyLoss", choice.policy_loss, A.POLICY_LOSSES)):
        if name and name not in entries:
            raise ConfigError(f"algorithm.{field}.name: {name!r} is not registered (known: {', '.join(sorted(entries))})")
    estimator = A.estimator_of(algorithm)
    if estimator is not None and estimator.needs_critic and "critic" not in config.roles:
        raise ConfigError(f"roles.critic: the advantage estimator {estimator.name} learns a critic; add roles.critic")
    for role, topo in config.roles.items():
        if role == "critic" and not (estimator is not None and estimator.needs_critic):
            raise ConfigError(f"roles.critic: {algorithm.name} has no critic; remove the role")
        if role == "ref" and not algorithm.needs_reference:
            raise ConfigError(f"roles.ref: {algorithm.name} uses no reference policy (klCoef is 0); remove the role or set algorithm.klCoef")
        if role == "reward" and (config.reward is None or config.reward.model is None):
            raise ConfigError("roles.reward: the reward role runs a reward model, but reward.model is not set")
        if role == "reward" and topo.colocated_with is None and (topo.layout.tp, topo.layout.pp) != (1, 1):
            raise ConfigError(f"roles.reward.layout: a reward model runs data-parallel only (tp=1, pp=1), not "
                              f"tp={topo.layout.tp}, pp={topo.layout.pp}")
    actor = config.roles["actor"]
    if actor.layout.tp % actor.rollout_tp:
        raise ConfigError(f"roles.actor.layout.rolloutTp: {actor.rollout_tp} must divide the actor's tp={actor.layout.tp}")
    if estimator is not None:
        samples = config.rollout.samples_per_prompt if config.rollout is not None else 1
        if samples < estimator.min_samples:
            raise ConfigError(f"rollout.samplesPerPrompt: {config.algorithm.name} ({estimator.name}) needs at least "
                              f"{estimator.min_samples} samples per prompt")
    if config.algorithm.name != "dpo" and config.reward is None:
        raise ConfigError("reward: a reward source is required for on-policy algorithms")


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
        self.dpo = algorithm.name == "dpo"

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
        self.encoder = PromptEncoder(self.tokenizer, data)
        self.train_examples = load_examples(data.train, data, base_dir, preferences=self.dpo)
        self.validation = load_examples(data.validation, data, base_dir) if data.validation and not self.dpo else []
        for example in self.train_examples + self.validation:
            self.encoder.encode(example)  # too long, or not renderable: refused now, with file:line
        self.loader = PromptLoader(self.train_examples, trainer.prompts_per_step, trainer.seed, data.shuffle)
        self.total_steps = trainer.total_steps or trainer.total_epochs * self.loader.steps_per_epoch

        hf_state = read_hf_state_dict(folder)
        self.actor = MegatronLM(self.arch, hf_state, dtype=self.dtype, optimizer=trainer.optimizer)
        self.needs_ref = algorithm.needs_reference
        estimator = A.estimator_of(algorithm)
        self.needs_critic = estimator is not None and estimator.needs_critic
        self.ref = MegatronLM(self.arch, hf_state, dtype=self.dtype) \
            if self.needs_ref and "ref" not in self.remote_roles else None
        self.critic = MegatronLM(self.arch, hf_state, dtype=self.dtype, optimizer=trainer.optimizer, value_head=True) \
            if self.needs_critic and "critic" not in self.remote_roles else None
        del hf_state
        self.dp_rank, self.dp_size = self.actor.place.dp_rank, self.actor.place.dp_size

        self.rewarder = None
        if self.is_controller and config.reward is not None and not self.dpo:
            from ..rewards import Rewarder

            remote = RemoteRewardModel(self.links["reward"]) if "reward" in self.links else None
            self.rewarder = Rewarder(config.reward, base_dir, remote_model=remote)

        # vLLM replicas of rollout_tp consecutive ranks each (rollout_tp = 1: one per rank).
        self.rollout_tp = config.roles["actor"].rollout_tp
        self.replica, self.replicas = self.rank // self.rollout_tp, self.world // self.rollout_tp
        self.rollout = self.resharder = None
        if not self.dpo:
            from ..rollout.vllm_backend import VLLMRollout

            spec = config.rollout
            assert spec is not None
            self.resharder = self._make_resharder(self.rollout_tp)  # refuses a layout it cannot serve before vLLM starts
            self.rollout = VLLMRollout(folder, dtype=_vllm_dtype(self.dtype), seed=trainer.seed + self.replica,
                                       max_model_len=data.max_prompt_length + spec.max_new_tokens,
                                       kv_cache_bytes=spec.kv_cache_bytes, gpu_memory_utilization=spec.gpu_memory_utilization,
                                       tensor_parallel_size=self.rollout_tp, skip_tokenizer_init=True)

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

    # -- lifecycle --------------------------------------------------------------------------------

    def _resume(self) -> None:
        steps = ckpt.complete_steps(self.checkpoints)
        if not steps:
            return
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
                        meta={"job": self.config.job, "algorithm": self.config.algorithm.name})
            self.last_checkpoint = ckpt.status(self.checkpoints, self.step)
        dist.barrier()
        return ckpt.step_dir(self.checkpoints, self.step)

    def run(self, progress=None, stop: StopRequest | None = None) -> dict[str, Any]:
        """Train to the last step, or until `stop` is requested on any rank of the job (then with a
        checkpoint of the step that was running, and `self.stopped` set); returns the controller's
        last record (empty on other ranks)."""
        trainer = self.config.trainer
        last: dict[str, Any] = {}
        if self.step == 0 and self.validation and trainer.validation_interval:
            last = {"step": 0, **self._validate()}
            self._publish(last)
        while self.step < self.total_steps:
            timer = Timer()
            record = self.dpo_step(timer) if self.dpo else self.rl_step(timer)
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

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()

    # -- the switch ---------------------------------------------------------------------------------

    def switch_to_rollout(self) -> dict[str, float]:
        """Make room (GPU: optimizer state and gradients leave the device), wake vLLM, and stream the
        actor's current weights into this rank's replica."""
        assert self.rollout is not None and self.resharder is not None
        offloaded = sum(model.offload() for model in self._trained_models())
        self.rollout.wake_up()  # GPU: vLLM's weights and KV cache come back (no-op on CPU)
        self.rollout.update_weights(self.resharder.stream(self.actor.megatron_state()))
        stats = self.resharder.stats.history[-1]
        return {"reshard_seconds": stats["seconds"], "reshard_bytes": stats["bytes_received"], "offloaded_bytes": offloaded}

    def switch_to_training(self) -> None:
        """The switch back: vLLM sleeps (GPU: KV cache freed, its weights to host memory) and the
        optimizer state and gradient buffers return. On CPU there is nothing to move."""
        assert self.rollout is not None
        self.rollout.sleep()
        for model in self._trained_models():
            model.onload()

    def _trained_models(self) -> list[MegatronLM]:
        return [m for m in (self.actor, self.critic) if m is not None]

    def _generate(self, prompts: list[list[int]], sampling, seed: int) -> list[tuple[int, list[int], list[float]]]:
        """Generate on every replica for its share of prompts; every rank gets all completions in prompt order."""
        mine = shard_rows(len(prompts), self.replica, self.replicas)
        # vLLM samples from torch's global generator: seeding it per step and replica makes a resumed
        # run draw the same samples as an uninterrupted one, and the ranks of a replica draw alike.
        torch.manual_seed(seed)
        completions = self.rollout.generate([prompts[i] for i in mine], sampling) if len(mine) else []
        # Every rank of a tensor-parallel replica holds the same completions: its first rank reports them.
        first_of_replica = self.rank % self.rollout_tp == 0
        local = [(mine.start + c.prompt_index, c.token_ids, c.logprobs) for c in completions] if first_of_replica else []
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, local)
        return [item for part in gathered for item in part]

    # -- one step -----------------------------------------------------------------------------------

    def rl_step(self, timer: Timer) -> dict[str, Any]:
        from ..rollout.vllm_backend import Sampling

        cfg, spec, algorithm = self.config, self.config.rollout, self.config.algorithm
        examples = self.loader.next_batch()
        prompts = [self.encoder.encode(e) for e in examples]
        record: dict[str, Any] = {"lr": learning_rate(cfg.trainer.optimizer, self.updates, self._total_updates())}

        with timer("reshard"):
            record.update(self.switch_to_rollout())
        sampling = Sampling(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
                            top_k=spec.top_k, n=spec.samples_per_prompt, stop_token_ids=self._stop_ids())
        with timer("rollout"):
            completions = self._generate(prompts, sampling, seed=cfg.trainer.seed * 1_000_003 + self.step * 1009 + self.replica)
        tokens = sum(len(c[1]) for c in completions)
        record["rollout_tokens_per_second"] = tokens / max(timer.seconds["rollout"], 1e-9)
        record["response_length_mean"] = tokens / max(1, len(completions))

        # The switch back to training needs nothing from the rewards: it runs while they are scored.
        back = Background(self.switch_to_training)
        with timer("reward"):
            scores, reward_parts = self._score(examples, completions)
        with timer("switch_back"):  # what the scoring did not hide
            record["switch_back_seconds"], record["switch_back_hidden_seconds"] = back.join()
        switch = record["reshard_seconds"] + record["switch_back_seconds"]
        record["switch_hidden_share"] = record["switch_back_hidden_seconds"] / switch if switch > 0 else 0.0
        record["reward_mean"] = float(scores.mean())
        record.update({f"reward/{k}": v for k, v in reward_parts.items()})

        seq_prompts = [prompts[i] for i, _, _ in completions]
        group = torch.tensor([i for i, _, _ in completions])
        batch = pack(seq_prompts, [c[1] for c in completions], self.pad_id)
        R = batch.mask.shape[1]
        batch.old_logprobs = _logprob_rows([c[2] for c in completions], R)

        # Roles on ranks of their own get both questions before either answer is awaited.
        if self.needs_ref:
            self._ask("ref", "logprobs", batch)
        if self.needs_critic:
            self._ask("critic", "values", batch)
        if self.needs_ref:
            with timer("reference"):
                batch.ref_logprobs = self._rows("ref", self.ref, batch)
        if self.needs_critic:
            with timer("values"):
                batch.old_values = self._rows("critic", self.critic, batch)

        with timer("advantages"):
            kl = None
            if batch.ref_logprobs is not None:
                kl = A.kl_estimate(batch.old_logprobs, batch.ref_logprobs, algorithm.kl_estimator) * batch.mask
                record["kl"] = float(A.masked_mean(kl, batch.mask))
            batch.advantages, batch.returns = self._advantages(scores, group, batch, kl)

        with timer("train"):
            record.update(self._update(batch))
        return record

    def _score(self, examples: list[Example], completions) -> tuple[torch.Tensor, dict[str, float]]:
        holder: list[Any] = [None]
        if self.is_controller:
            texts = self.tokenizer.batch_decode([c[1] for c in completions], skip_special_tokens=True)
            prompts = [self.encoder.text(examples[i]) for i, _, _ in completions]
            answers = [examples[i].answer for i, _, _ in completions]
            holder[0] = self.rewarder.score(prompts, texts, answers)
        dist.broadcast_object_list(holder, src=0)
        scores, parts = holder[0]
        return torch.tensor(scores, dtype=torch.float32), parts

    def _advantages(self, scores: torch.Tensor, group: torch.Tensor, batch: SeqBatch, kl: torch.Tensor | None):
        algorithm = self.config.algorithm
        choice = A.choice_of(algorithm)
        penalty = algorithm.kl_coef * kl if kl is not None and algorithm.kl_in_reward else None
        inputs = A.AdvantageInputs(scores=scores, group=group, mask=batch.mask, values=batch.old_values, kl_penalty=penalty)
        out = A.advantage_estimator(choice.advantage).fn(inputs, **choice.advantage_options)
        return out.advantages, out.returns

    def _update(self, batch: SeqBatch) -> dict[str, float]:
        """Mini-batch updates of the actor (and critic) over this step's sequences, split over DP."""
        trainer, algorithm = self.config.trainer, self.config.algorithm
        size = trainer.mini_batch_size or len(batch)
        plan = []  # (start, end, lr) of every update, in order
        for _ in range(algorithm.update_epochs):
            for start in range(0, len(batch), size):
                plan.append((start, min(start + size, len(batch)),
                             learning_rate(trainer.optimizer, self.updates + len(plan), self._total_updates())))
        self.updates += len(plan)
        if self.needs_critic:
            self._ask("critic", "train", {"batch": batch, "plan": plan})  # trains while the actor does
        stats = mean_of(self.actor.train_plan(batch, plan, policy_loss_fn(algorithm), trainer.micro_batch_size))
        out = mean_over(stats)
        if self.needs_critic:
            if self.critic is not None:
                critic = mean_over(mean_of(self.critic.train_plan(batch, plan, value_loss_fn(algorithm), trainer.micro_batch_size)))
            else:
                critic = self._answer("critic")
            out.update({f"critic/{k}": v for k, v in critic.items()})
        return out

    def dpo_step(self, timer: Timer) -> dict[str, Any]:
        trainer, algorithm = self.config.trainer, self.config.algorithm
        dpo = algorithm.dpo or DPOSpec()
        beta, smoothing = dpo.beta, dpo.label_smoothing
        examples = self.loader.next_batch()
        eos = self.tokenizer.eos_token_id
        prompts, responses = [], []
        for e in examples:  # rows alternate: chosen, rejected of the same pair
            p = self.encoder.encode(e)
            for text in (e.chosen, e.rejected):
                prompts.append(p)
                responses.append(self.tokenizer.encode(text, add_special_tokens=False) + ([eos] if eos is not None else []))
        batch = pack(prompts, responses, self.pad_id)
        self._ask("ref", "logprobs", batch)
        with timer("reference"):
            batch.ref_logprobs = self._rows("ref", self.ref, batch)
        # For dpo the batch sizes count pairs: a micro-batch of k pairs holds 2k rows.
        pairs = len(examples)
        size = trainer.mini_batch_size or pairs

        def loss_fn(logits: torch.Tensor, mb: SeqBatch):
            seq = response_logprobs_from_logits(logits, mb).sum(-1)
            ref_seq = (mb.ref_logprobs * mb.mask).sum(-1)
            loss, st = A.dpo_loss(seq[0::2], seq[1::2], ref_seq[0::2], ref_seq[1::2], beta, smoothing)
            return loss, {"dpo_loss": loss.detach(), **st}

        updates = []
        with timer("train"):
            for start in range(0, pairs, size):
                mini = range(start, min(start + size, pairs))
                mine = shard_rows(len(mini), self.dp_rank, self.dp_size)
                rows = [r for p in mine for r in (2 * mini[p], 2 * mini[p] + 1)]
                lr = learning_rate(trainer.optimizer, self.updates, self._total_updates())
                updates.append(self.actor.train_step(micro_batches(batch.select(rows), 2 * trainer.micro_batch_size), loss_fn, lr))
                self.updates += 1
        return {"lr": lr, **mean_over(mean_of(updates))}

    # -- validation and export -----------------------------------------------------------------------

    def _validate(self) -> dict[str, float]:
        from ..rollout.vllm_backend import Sampling

        self.switch_to_rollout()
        prompts = [self.encoder.encode(e) for e in self.validation]
        greedy = Sampling(max_new_tokens=self.config.rollout.max_new_tokens, temperature=0.0, stop_token_ids=self._stop_ids())
        completions = self._generate(prompts, greedy, seed=0)
        self.switch_to_training()
        scores, _ = self._score(self.validation, completions)
        return {"validation_reward_mean": float(scores.mean())}

    def export(self, out: Path) -> None:
        """Write the current policy as a Hugging Face folder (controller rank)."""
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
        from .world import model_parallel_ranks

        place = self.actor.place
        try:
            return Resharder(self.arch, place.tp, place.pp, place.pp_rank, place.tp_rank, model_parallel_ranks(),
                             ps.get_model_parallel_group(), dtype=self.dtype, tg=tg)
        except ValueError as exc:
            raise ConfigError(f"roles.actor.layout.rolloutTp: {exc}") from None

    # -- helpers --------------------------------------------------------------------------------------

    def _stop_ids(self) -> tuple[int, ...]:
        ids = {self.tokenizer.eos_token_id}
        if self.tokenizer.pad_token_id is not None:
            ids.add(self.tokenizer.pad_token_id)
        return tuple(sorted(i for i in ids if i is not None))

    def _total_updates(self) -> int:
        trainer, algorithm = self.config.trainer, self.config.algorithm
        if self.dpo:
            return self.total_steps * math.ceil(trainer.prompts_per_step / (trainer.mini_batch_size or trainer.prompts_per_step))
        per_step = trainer.prompts_per_step * (self.config.rollout.samples_per_prompt if self.config.rollout else 1)
        minis = math.ceil(per_step / (trainer.mini_batch_size or per_step))
        return self.total_steps * minis * algorithm.update_epochs

    def _ask(self, role: str, command: str, payload: Any) -> None:
        """Send a role on ranks of its own a command (controller; nothing for colocated roles)."""
        if role in self.links:
            self.links[role].send(command, payload)

    def _answer(self, role: str) -> Any:
        """The role's reply to the oldest pending command, on every actor rank."""
        holder = [self.links[role].result() if self.is_controller else None]
        if self.world > 1:
            dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def _rows(self, role: str, model: MegatronLM | None, batch: SeqBatch) -> torch.Tensor:
        """Log-probs (reference) or values (critic) of every row, from the colocated model or the role's ranks."""
        if role in self.remote_roles:
            return self._answer(role)
        compute = model.response_values if model.value_head else model.response_logprobs
        return model.rows_over_dp(compute, batch, self.config.trainer.micro_batch_size)


def _logprob_rows(rows: list[list[float]], width: int) -> torch.Tensor:
    """Per-token log-prob lists as a [B, width] tensor, zero-padded on the right."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def torch_dtype(name: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _vllm_dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]

"""Multi-turn rollouts on vLLM: the policy writes, its environment answers (tool results), and it
goes on, until a final answer (the environment says done), rollout.multiTurn.maxTurns or maxTotalTokens.

Turn by turn, all live trajectories of a replica generate together in one vLLM call; then the
environments of those that called tools step concurrently (each tool call within its own timeout),
their answers are appended as chat messages rendered by the template, and the next turn generates
from the whole conversation so far, which vLLM's prefix cache mostly holds already (the KV blocks
of earlier turns are not recomputed). A trajectory pauses while its calls run; the others of the
turn wait for the slowest call (turn-synchronous batching: simple, and exact on resume).

Each replica runs its share of the prompts (as rollout/generation.py does) and every rank gets all
trajectories. The ranks of a tensor-parallel replica must call vLLM alike: its first rank steps the
environments and the others take its answers (one gather over the actor's world per turn, every
rank looping the same number of turns). Seeds: the first turn's is the step's, as in one-turn
rollouts; turn t adds t * TURN_SEED, so a resumed run draws the same trajectories.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..agents import ChatRenderer, EnvironmentSetup, Observation, environment_entry
from ..data import DataError, Example, PromptEncoder
from ..training.sequences import shard_rows
from .generation import Generator
from .trajectory import Builder, Trajectory
from .vllm_backend import Sampling

TURN_SEED = 104_729
MAX_CONCURRENT_STEPS = 64


class MultiTurnRollout:
    def __init__(
        self,
        generator: Generator,
        renderer: ChatRenderer,
        setup: EnvironmentSetup,
        encoder: PromptEncoder,
        max_prompt_length: int,
        stop_ids: tuple[int, ...],
    ):
        self.generator, self.renderer, self.setup, self.encoder = generator, renderer, setup, encoder
        self.max_prompt_length, self.stop_ids = max_prompt_length, stop_ids
        self.spec = setup.spec
        entry = environment_entry(self.spec.environment)
        options = self.spec.environment_kwargs
        self.make_env: Callable[[], Any] = lambda: entry.factory(setup, **options)
        self.prefix_cache_hit_ratio: float | None = None
        self.sync = generator.rollout_tp > 1
        self.leader = generator.rank % generator.rollout_tp == 0

    # -- the replica's loop ---------------------------------------------------------------------------

    def _share(self, value: Any) -> Any:
        """The replica's first rank's `value` on every rank of the replica (tensor-parallel replicas only)."""
        if not self.sync:
            return value
        g = self.generator
        gathered: list = [None] * g.world
        dist.all_gather_object(gathered, value if self.leader else None)
        return gathered[g.replica * g.rollout_tp]

    def _start(self, examples: list[Example], rows: range, samples: int) -> tuple[list[list[int]], list[Builder]]:
        envs = {i: [self.make_env() for _ in range(samples)] if self.leader else [None] * samples for i in rows}
        messages = None
        if self.leader:
            # Each sample has its environment; the prompt is the first's (reset must depend on the example only).
            messages = [[env.reset(examples[i], [dict(m) for m in self.encoder.messages(examples[i])]) for env in envs[i]][0] for i in rows]
        messages = self._share(messages)  # one gather for all rows: every rank of the world gathers alike
        builders, prompts = [], []
        for i, conversation in zip(rows, messages):
            ids = self.renderer.prompt_ids(conversation)
            if len(ids) > self.max_prompt_length:
                raise DataError(
                    f"{examples[i].where}: the prompt has {len(ids)} tokens with the tools described, more than "
                    f"data.maxPromptLength = {self.max_prompt_length}"
                )
            prompts.append(ids)
            builders += [Builder(i, conversation, env) for env in envs[i]]
        return prompts, builders

    def _generate(self, prompts: list[list[int]], sampling: Sampling, limits: list[int], seed: int, n: int):
        rollout = self.generator.rollout
        torch.manual_seed(seed)
        return rollout.generate(
            prompts,
            Sampling(sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k, n, sampling.stop_token_ids),
            limits,
        )

    def _steps(self, stepping: list[Builder]) -> list[Observation]:
        if not self.leader or not stepping:
            return [Observation() for _ in stepping] if self.leader else []
        with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT_STEPS, len(stepping))) as pool:
            return list(pool.map(lambda b: b.env.step(b.last_text), stepping))

    def _replica(self, examples: list[Example], rows: range, sampling: Sampling, seed: int) -> tuple[list[list[int]], list[Trajectory]]:
        spec, budget = self.spec, self.spec.max_total_tokens
        prompts, builders = self._start(examples, rows, sampling.n)
        first = (
            self._generate(prompts, sampling, [min(sampling.max_new_tokens, budget)] * len(prompts), seed, sampling.n) if prompts else []
        )
        for builder, completion in zip(builders, first):
            builder.add_turn(
                completion, self.renderer.assistant_text(completion.token_ids, _stop(completion, self.stop_ids)), self.stop_ids
            )
        live = builders
        for turn in range(1, spec.max_turns + 1):
            # Every turn goes to its environment (the last one too: its reward counts; one cut off at
            # maxNewTokens as well, as it stands), but for a trajectory that used up maxTotalTokens.
            stepping = [b for b in live if len(b.tokens) < budget]
            observations = self._share(self._steps(stepping))
            going = []
            for builder, observation in zip(stepping, observations):
                builder.add_observation(observation)
                if observation.done or not observation.messages or turn == spec.max_turns:
                    continue
                ids = self.renderer.continuation_ids(observation.messages, builder.last_stop)
                if len(builder.tokens) + len(ids) >= budget:
                    continue  # no room for the answer and a turn after it: the trajectory ends here
                builder.add_tokens(ids, observation.messages)
                going.append(builder)
            live = going
            if not live:
                if self.sync:
                    continue  # every rank of the actor's world loops alike (the gathers of _share)
                break
            limits = [min(sampling.max_new_tokens, budget - len(b.tokens)) for b in live]
            outputs = self._generate(
                [prompts[rows.index(b.prompt_index)] + b.tokens for b in live], sampling, limits, seed + turn * TURN_SEED, 1
            )
            for builder, completion in zip(live, outputs):
                builder.add_turn(
                    completion, self.renderer.assistant_text(completion.token_ids, _stop(completion, self.stop_ids)), self.stop_ids
                )
        return prompts, [b.build() for b in builders]

    # -- across the replicas ----------------------------------------------------------------------------

    def generate(self, examples: list[Example], sampling: Sampling, seed: int) -> tuple[list[list[int]], list[Trajectory]]:
        """Every example's prompt (tools described) and its trajectories, in prompt order, on every rank."""
        g = self.generator
        rows = shard_rows(len(examples), g.replica, g.replicas)
        before = g.rollout.prefix_cache_counters()
        prompts, trajectories = self._replica(examples, rows, sampling, seed)
        queried, hits = (a - b for a, b in zip(g.rollout.prefix_cache_counters(), before))
        self.prefix_cache_hit_ratio = hits / queried if queried else None
        if not (dist.is_available() and dist.is_initialized()):
            return prompts, trajectories
        local = (rows.start, prompts, trajectories) if self.leader else None
        gathered: list = [None] * g.world
        dist.all_gather_object(gathered, local)
        all_prompts: list[list[int]] = [[] for _ in examples]
        out: list[Trajectory] = []
        for part in gathered:
            if part is None:
                continue
            start, ps, ts = part
            for offset, p in enumerate(ps):
                all_prompts[start + offset] = p
            out += ts
        return all_prompts, out


def _stop(completion: Any, stop_ids: tuple[int, ...]) -> int | None:
    ids = completion.token_ids
    return ids[-1] if completion.finished_by_stop and ids and ids[-1] in stop_ids else None

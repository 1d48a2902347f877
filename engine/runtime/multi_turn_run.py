"""A multi-turn job's parts, composed for rl.py: its tools, the chat template that describes them,
the rollout loop, and what its rewards read. A job without rollout.multiTurn has none of them.

The tokenizer's own chat template is kept where it describes tools to the model; otherwise the
parser's template (Hermes/Qwen's <tool_call> format in ChatML for the hermes parser) replaces it for
the whole run, so that prompts, turns and tool results are rendered alike (SmolLM2's template, for
one, has no tools: it ignores `tools=` and has no tool role).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..agents import ENVIRONMENTS, PARSERS, ChatRenderer, EnvironmentSetup, ToolError, build_tools, describes_tools, parser_entry
from ..config.multi_turn import MultiTurnSpec
from ..config.topology import EngineConfig
from ..data import PromptEncoder
from ..rewards.rewarder import SourceScores
from ..rollout.generation import Generator
from ..rollout.multi_turn import MultiTurnRollout
from ..rollout.trajectory import Trajectory
from .algorithm_checks import ConfigError

log = logging.getLogger("kuberl.engine")
ENVIRONMENT_SOURCE = "environment"


def check_multi_turn(spec: MultiTurnSpec | None) -> None:
    """The parser and the environment are registered (the job's plug-ins loaded), and the environment takes its options."""
    if spec is None:
        return
    if spec.parser not in PARSERS:
        raise ConfigError(f"rollout.multiTurn.parser: {spec.parser!r} is not registered (known: {', '.join(sorted(PARSERS))})")
    if spec.environment not in ENVIRONMENTS:
        raise ConfigError(
            f"rollout.multiTurn.environment: {spec.environment!r} is not registered "
            f"(known: {', '.join(sorted(ENVIRONMENTS))}; a plug-in file of algorithm.plugins may register one)"
        )
    factory = ENVIRONMENTS[spec.environment].factory
    try:
        inspect.signature(factory).bind(None, **spec.environment_kwargs)
    except TypeError as exc:
        raise ConfigError(f"rollout.multiTurn.environmentOptions: {spec.environment} does not take these options: {exc}") from None


@dataclass(frozen=True)
class AgentParts:
    setup: EnvironmentSetup
    schemas: list[dict[str, Any]]
    """The tools as the chat template describes them."""


def prepare_agents(config: EngineConfig, tokenizer: Any, base_dir: Path) -> AgentParts | None:
    """The job's tools, set up (a function's schema read in the sandbox), and a chat template that
    describes them on `tokenizer`; None for a job of one-turn rollouts."""
    spec = config.rollout.multi_turn if config.rollout is not None else None
    if spec is None:
        return None
    parser = parser_entry(spec.parser)
    if not describes_tools(tokenizer):
        tokenizer.chat_template = parser.template
        log.info("the tokenizer's chat template does not describe tools: using the %s parser's template", parser.name)
    try:
        tools = build_tools(spec.tools, base_dir, allow_unisolated=spec.allow_unisolated_tools)
    except ToolError as exc:
        raise ConfigError(str(exc)) from None
    setup = EnvironmentSetup(spec, tools, parser)
    try:
        ENVIRONMENTS[spec.environment].factory(setup, **spec.environment_kwargs)  # its options are checked on making one
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"rollout.multiTurn.environmentOptions: {exc}") from None
    return AgentParts(setup, [tool.schema() for tool in tools.values()])


def multi_turn_rollout(
    parts: AgentParts, generator: Generator, encoder: PromptEncoder, config: EngineConfig, stop_ids: tuple[int, ...]
) -> MultiTurnRollout:
    renderer = ChatRenderer(encoder.tokenizer, parts.schemas)
    return MultiTurnRollout(generator, renderer, parts.setup, encoder, config.data.max_prompt_length, stop_ids)


def reward_inputs(completions: Sequence[Any], texts: list[str]) -> tuple[list[str], list[list[dict[str, Any]]] | None]:
    """The responses the rewards read, and the conversations: a trajectory's last turn and its
    messages; a one-turn completion's decoded text (and no conversations when none is multi-turn)."""
    if not any(isinstance(c, Trajectory) for c in completions):
        return texts, None
    responses = [c.response if isinstance(c, Trajectory) else text for c, text in zip(completions, texts)]
    messages = [c.messages if isinstance(c, Trajectory) else [] for c in completions]
    return responses, messages


def with_environment(scored: SourceScores, completions: Sequence[Any]) -> SourceScores:
    """`scored` plus the environments' own rewards (a source of weight 1), where an environment gave any."""
    rewards = [c.env_reward if isinstance(c, Trajectory) else 0.0 for c in completions]
    if not any(rewards):
        return scored
    totals = [t + r for t, r in zip(scored.totals, rewards)]
    return SourceScores(totals, {**scored.sources, ENVIRONMENT_SOURCE: rewards}, {**scored.weights, ENVIRONMENT_SOURCE: 1.0})

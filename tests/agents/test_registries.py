"""The multi-turn API and registries: rules of rollout.multiTurn, what the engine checks before a run,
the chat template a run picks, and the environment's rewards as a reward source."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kuberl.engine.agents import (
    ENVIRONMENTS,
    PARSERS,
    Environment,
    Observation,
    describes_tools,
    parse_hermes,
    register_environment,
    register_parser,
)
from kuberl.engine.config.multi_turn import MultiTurnSpec, ToolSpec
from kuberl.engine.config.rollout import RolloutSpec
from kuberl.engine.rewards.rewarder import SourceScores
from kuberl.engine.rollout.trajectory import Trajectory
from kuberl.engine.runtime.checks import ConfigError
from kuberl.engine.runtime.multi_turn_run import check_multi_turn, reward_inputs, with_environment
from kuberl.engine.training.sequences import MaskedTokens


def test_tool_kinds_and_rules() -> None:
    assert ToolSpec(name="calculator").kind == "builtin"
    assert ToolSpec(name="lookup", path="/t/lookup.py").kind == "function"
    assert ToolSpec(name="search", url="http://search:8080/").kind == "http"
    for bad in (
        {"name": "python", "url": "http://x:1/"},
        {"name": "lookup"},
        {"name": "lookup", "path": "/t/x.py", "url": "http://x:1/"},
        {"name": "lookup", "url": "http://x:1/", "function": "f"},
        {"name": "lookup", "path": "/t/x.txt"},
    ):
        with pytest.raises(ValidationError):
            ToolSpec(**bad)


def test_multi_turn_rules_and_budget() -> None:
    with pytest.raises(ValidationError, match="each tool name may appear once"):
        MultiTurnSpec(tools=[ToolSpec(name="calculator"), ToolSpec(name="calculator")])
    with pytest.raises(ValidationError, match="needs at least one tool"):
        MultiTurnSpec()
    MultiTurnSpec(environment="guess_number")  # another environment may need no tools
    with pytest.raises(ValidationError, match="at least maxNewTokens"):
        RolloutSpec(max_new_tokens=64, multi_turn=MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_total_tokens=32))
    spec = RolloutSpec(
        max_new_tokens=64,
        multi_turn=MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_total_tokens=300, environment_options={"fewShot": []}),
    )
    assert spec.max_response_tokens == 300 and RolloutSpec(max_new_tokens=64).max_response_tokens == 64
    assert spec.multi_turn.environment_kwargs == {"few_shot": []}


def test_the_engine_checks_parser_environment_and_options() -> None:
    tools = [ToolSpec(name="calculator")]
    check_multi_turn(MultiTurnSpec(tools=tools))
    check_multi_turn(None)
    with pytest.raises(ConfigError, match="rollout.multiTurn.parser: 'mistral' is not registered"):
        check_multi_turn(MultiTurnSpec(tools=tools, parser="mistral"))
    with pytest.raises(ConfigError, match="rollout.multiTurn.environment: 'maze' is not registered"):
        check_multi_turn(MultiTurnSpec(tools=tools, environment="maze"))
    with pytest.raises(ConfigError, match="environmentOptions: tools does not take these options"):
        check_multi_turn(MultiTurnSpec(tools=tools, environment_options={"shots": 3}))


def test_a_parser_and_an_environment_are_one_registration_each() -> None:
    @register_parser("bracket", template="{{ messages }}", summary="[call name]")
    def bracket(text):
        return parse_hermes(text.replace("[", "<tool_call>").replace("]", "</tool_call>"))

    @register_environment("echo", summary="says the turn back once")
    def echo(setup):
        class Echo(Environment):
            def step(self, text):
                return Observation([{"role": "user", "content": text}], done=False)

        return Echo()

    try:
        check_multi_turn(MultiTurnSpec(parser="bracket", environment="echo"))
        assert PARSERS["bracket"].parse('[{"name": "f", "arguments": {"x": 1}}]').calls[0].arguments == {"x": 1}
        with pytest.raises(ValueError, match="registered twice"):
            register_parser("bracket", template="", summary="")(bracket)
    finally:
        del PARSERS["bracket"], ENVIRONMENTS["echo"]


def test_hermes_parsing() -> None:
    parsed = parse_hermes(
        'I will add. <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call><tool_call>{"name": "g"'
    )
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "1+2"}), ("f", {"a": 1})]
    assert len(parsed.errors) == 1 and "could not read" in parsed.errors[0]  # the unclosed last one is malformed JSON
    assert not parse_hermes("The answer is 3.").wants_tools


def test_tokenizer_templates(smollm2_tokenizer) -> None:
    assert not describes_tools(smollm2_tokenizer)
    saved = smollm2_tokenizer.chat_template
    try:
        smollm2_tokenizer.chat_template = PARSERS["hermes"].template
        assert describes_tools(smollm2_tokenizer)
    finally:
        smollm2_tokenizer.chat_template = saved


def test_rewards_read_last_turns_and_environment_rewards() -> None:
    from kuberl.engine.rollout.vllm_backend import Completion

    t = Trajectory(
        0,
        MaskedTokens([1, 2, 3], [1, 0, 1]),
        [-1.0, 0.0, -1.0],
        True,
        messages=[{"role": "user", "content": "q"}],
        response="42",
        env_reward=0.5,
        turns=2,
    )
    plain = Completion(0, [4], [-1.0], True)
    assert reward_inputs([plain], ["text"]) == (["text"], None)
    assert reward_inputs([t, plain], ["whole", "text"]) == (["42", "text"], [t.messages, []])
    scored = with_environment(SourceScores([1.0, 0.0], {"math_answer": [1.0, 0.0]}, {"math_answer": 1.0}), [t, plain])
    assert scored.totals == [1.5, 0.0] and scored.sources["environment"] == [0.5, 0.0] and scored.weights["environment"] == 1.0
    assert t.policy_tokens == 2

"""A trajectory with two tool calls, rendered, masked and scored: token by token against the chat template."""

from __future__ import annotations

import json

import pytest

from kuberl.engine.agents import ChatRenderer, EnvironmentSetup, build_tools, describes_tools, parser_entry
from kuberl.engine.config import DataSpec
from kuberl.engine.config.multi_turn import MultiTurnSpec, ToolSpec
from kuberl.engine.data import Example, PromptEncoder
from kuberl.engine.rewards import Rewarder
from kuberl.engine.config.reward import RewardSpec
from kuberl.engine.rollout.generation import Generator
from kuberl.engine.rollout.multi_turn import MultiTurnRollout
from kuberl.engine.rollout.vllm_backend import Sampling
from kuberl.engine.training.packing import packed_inputs
from kuberl.engine.training.sequences import pack

from .conftest import ScriptedRollout

CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
SYSTEM = "You are a calculator."


def two_calls(prompt: str, sample: int) -> str:
    """Adds the question's numbers two at a time with the calculator, then answers."""
    if "<tool_response>\n42" in prompt and "<tool_response>\n49" in prompt:
        return "The sum is 49"
    if "<tool_response>\n42" in prompt:
        return CALL.format("42 + 7")
    return "Let me add. " + CALL.format("12 + 30")


@pytest.fixture
def tool_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    saved = tok.chat_template
    assert not describes_tools(tok)  # SmolLM2's own template ignores tools= and has no tool role
    tok.chat_template = parser_entry("hermes").template
    assert describes_tools(tok)
    yield tok
    tok.chat_template = saved


def loop(tokenizer, reply, spec: MultiTurnSpec) -> tuple[MultiTurnRollout, ScriptedRollout]:
    tools = build_tools(spec.tools)
    schemas = [t.schema() for t in tools.values()]
    encoder = PromptEncoder(tokenizer, DataSpec(train={"generator": {"name": "arithmetic"}}, system_prompt=SYSTEM), tools=schemas)
    scripted = ScriptedRollout(tokenizer, reply)
    rollout = MultiTurnRollout(
        Generator(scripted, 0, 1, 1),
        ChatRenderer(tokenizer, schemas),
        EnvironmentSetup(spec, tools, parser_entry(spec.parser)),
        encoder,
        512,
        (tokenizer.eos_token_id,),
    )
    return rollout, scripted


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_two_tool_calls_render_mask_and_score_exactly(tool_tokenizer) -> None:
    tok = tool_tokenizer
    spec = MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_turns=4, max_total_tokens=400)
    rollout, scripted = loop(tok, two_calls, spec)
    example = Example("What is 12 + 30 + 7?", answer="49")
    prompts, [t] = rollout.generate([example], Sampling(max_new_tokens=64, n=1, stop_token_ids=(tok.eos_token_id,)), seed=0)

    assert (t.turns, t.tool_calls, t.tool_errors, t.finished_by_stop) == (3, 2, 0, True)
    assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["content"] for m in t.messages if m["role"] == "tool"] == ["42", "49"]
    # The whole sequence is the chat template's rendering of the conversation, token for token (but
    # the newline the template writes after the last <|im_end|>, which the policy does not write).
    rendered = tok.apply_chat_template(t.messages, tools=rollout.renderer.tools, tokenize=False)
    assert rendered.endswith("<|im_end|>\n")
    assert prompts[0] + list(t.token_ids) == tok.encode(rendered[:-1], add_special_tokens=False)
    # The mask is 1 on exactly the policy's tokens: each of its turns, stop token included.
    mask = t.token_ids.mask
    turns = [m["content"] for m in t.messages if m["role"] == "assistant"]
    assert [tok.decode(t.token_ids[a:b]) for a, b in runs(mask)] == [c + "<|im_end|>" for c in turns]
    masked_out = tok.decode([x for x, m in zip(t.token_ids, mask) if not m])
    assert masked_out == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        "\n<|im_start|>user\n<tool_response>\n49\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.logprobs == [-0.25 if m else 0.0 for m in mask]
    assert t.policy_tokens == sum(mask) and t.response == "The sum is 49"
    # Each turn after the first generated from the whole conversation so far.
    starts = [a for a, _ in runs(mask)]
    assert [call[0] for call in scripted.calls] == [[prompts[0] + list(t.token_ids)[:start]] for start in starts]

    # Packed as one sequence: the loss mask is the trajectory's, the prompt unmasked.
    batch = pack(prompts, [t.token_ids], tok.pad_token_id)
    assert batch.mask[0, : len(mask)].tolist() == [float(m) for m in mask]
    assert int(batch.response_lens[0]) == len(t.token_ids)

    # Scored on the last turn, with the conversation for a function that takes it.
    def tools_used(prompt, response, answer, messages):
        return float(sum(m["role"] == "tool" for m in messages))

    rewarder = Rewarder(RewardSpec(rules=[{"name": "math_answer"}]))
    rewarder.parts.append(type(rewarder.parts[0])("tools_used", 0.5, tools_used, {}))
    scored = rewarder.score_sources(["q"], [t.response], [example.answer], [t.messages])
    assert scored.sources == {"math_answer": [1.0], "tools_used": [2.0]} and scored.totals == [2.0]


def test_samples_share_their_prompt_and_pack_with_one_copy(tool_tokenizer) -> None:
    tok = tool_tokenizer
    spec = MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_turns=3)
    # Sample 0 answers at once; sample 1 calls the calculator first.
    reply = lambda prompt, s: "49" if s == 0 or "<tool_response>" in prompt else CALL.format("12 + 30 + 7")  # noqa: E731
    rollout, _ = loop(tok, reply, spec)
    prompts, trajectories = rollout.generate([Example("What is 12 + 30 + 7?", "49")], Sampling(max_new_tokens=64, n=2), seed=0)
    assert [t.turns for t in trajectories] == [1, 2] and [t.response for t in trajectories] == ["49", "49"]
    batch = pack([prompts[0]] * 2, [t.token_ids for t in trajectories], tok.pad_token_id)
    shared = packed_inputs(batch, share_prefix=True)
    assert len(shared.segments) == 1  # one copy of the prompt for both samples
    assert shared.input_ids.shape[1] == len(prompts[0]) + sum(len(t.token_ids) - 1 for t in trajectories)


def test_limits_end_a_trajectory(tool_tokenizer) -> None:
    tok = tool_tokenizer
    always_call = lambda prompt, s: CALL.format("1 + 1")  # noqa: E731
    # maxTurns: the environment answers the last turn's call (it is counted), but nothing follows it.
    rollout, _ = loop(tok, always_call, MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_turns=2))
    _, [t] = rollout.generate([Example("What is 1 + 1?", "2")], Sampling(max_new_tokens=64), seed=0)
    assert (t.turns, t.tool_calls) == (2, 2)
    assert tok.decode(t.token_ids).endswith("</tool_call><|im_end|>")
    # maxTotalTokens: the second turn gets what is left of the budget, and is cut there.
    rollout, scripted = loop(tok, always_call, MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_turns=4, max_total_tokens=60))
    _, [t] = rollout.generate([Example("What is 1 + 1?", "2")], Sampling(max_new_tokens=64), seed=0)
    assert len(t.token_ids) == 60 and not t.finished_by_stop and t.turns == 2
    assert scripted.calls[1][1] == [60 - len(scripted.calls[1][0][0]) + len(scripted.calls[0][0][0])]


def test_unreadable_and_excess_calls_are_answered_with_errors(tool_tokenizer) -> None:
    tok = tool_tokenizer
    many = (
        "".join(CALL.format(f"{i} * 2") for i in range(3))
        + "<tool_call>{not json</tool_call>"
        + '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    )
    reply = lambda prompt, s: "done" if "<tool_response>" in prompt else many  # noqa: E731
    rollout, _ = loop(tok, reply, MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_tool_calls_per_turn=3))
    _, [t] = rollout.generate([Example("go", "0")], Sampling(max_new_tokens=200), seed=0)
    results = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert results[:3] == ["0", "2", "4"]
    assert "at most 3 tool calls" in results[3] and "could not read the tool call" in results[4]
    assert (t.tool_calls, t.tool_errors) == (5, 2)
    assert json.dumps(t.messages)  # the conversation is plain data (it is gathered and pickled)

"""A tiny model taught to call the calculator: a few hundred SFT steps (plain torch, a few seconds of CPU)
on conversations rendered exactly as a multi-turn job renders them (the job's prompt with the tools
described, the hermes parser's template), in which the assistant writes
`<tool_call>{"name": "calculator", "arguments": {"expression": "<a> + <b>"}}</tool_call>` for the
question's operands, reads the result, and answers it. What it then writes under vLLM is its own sampling:
the tests read the tool calls out of its text, as a job does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

TOOL_ROLLOUT = {
    "maxNewTokens": 40,
    "temperature": 1.0,
    "kvCacheBytes": 64 << 20,
    "multiTurn": {"maxTurns": 2, "maxTotalTokens": 80, "tools": [{"name": "calculator", "timeoutSeconds": 5}]},
}
TOOL_REWARD = [{"name": "math_answer"}, {"name": "format", "args": {"pattern": r"\s*\d*[13579]\s*"}}]
"""The right sum, plus an answer ending in an odd digit: the taught model calls the calculator every time but
rarely copies its result, so the sum alone scores a group all 0 and GRPO's and RLOO's advantages would be 0;
the parity of its sampled answer differs within a group."""
TOOL_DATA = {
    "train": {"generator": {"name": "arithmetic", "count": 64, "seed": 1, "maxOperand": 9}},
    "maxPromptLength": 400,
    "systemPrompt": "Use the calculator.",
}


def call_text(expression: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "\n</tool_call>"


def _conversations(job: Path, tokenizer: Any, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(tokens, loss mask) of `count` taught conversations of the job's own prompts and chat rendering."""
    import random

    from kuberl.engine.agents import ChatRenderer, build_tools, describes_tools, parser_entry
    from kuberl.engine.agents.calculator import evaluate, format_number
    from kuberl.engine.data import PromptEncoder
    from kuberl.engine.data.prompts import Example
    from kuberl.operator.validation.manifest import load_rljobs

    [rljob] = load_rljobs(job)
    spec = rljob.spec
    multi = spec.rollout.multi_turn
    if not describes_tools(tokenizer):
        tokenizer.chat_template = parser_entry(multi.parser).template
    schemas = [t.schema() for t in build_tools(multi.tools).values()]
    renderer = ChatRenderer(tokenizer, schemas)
    encoder = PromptEncoder(tokenizer, spec.data, tools=schemas)
    stop = tokenizer.eos_token_id
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        expression = f"{a} + {b}"
        example = Example(prompt=f"What is {expression}?", answer=str(a + b))
        prompt = renderer.prompt_ids(encoder.messages(example))
        result = format_number(evaluate(expression))
        call = renderer.encode(call_text(expression)) + [stop]
        between = renderer.continuation_ids([{"role": "tool", "name": "calculator", "content": result}], stop)
        answer = renderer.encode(result) + [stop]
        tokens = prompt + call + between + answer
        mask = [0] * len(prompt) + [1] * len(call) + [0] * len(between) + [1] * len(answer)
        out.append((tokens, mask))
    return out


def teach_tool_calls(base: Path, job: Path, out: Path, steps: int = 300, seed: int = 0) -> Path:
    """`base` (a tiny HF Llama folder) after `steps` SFT steps on taught conversations; saved to `out`."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    data = _conversations(job, tokenizer, 256, seed)
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # faster than 2 on a busy machine, for ops this small
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)  # 1e-2 stalls at a loss of ~1.7 nats a token
    width = max(len(t) for t, _ in data)
    pad = tokenizer.pad_token_id or 0
    tokens = torch.tensor([t + [pad] * (width - len(t)) for t, _ in data])
    masks = torch.tensor([m + [0] * (width - len(m)) for _, m in data], dtype=torch.float32)
    attention = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t, _ in data])
    model.train()
    losses = []
    for step in range(steps):
        rows = torch.randint(0, len(data), (8,))
        hidden = model.model(input_ids=tokens[rows], attention_mask=attention[rows]).last_hidden_state[:, :-1]
        taught = masks[rows][:, 1:].bool()  # logits only where the loss reads them: the assistant's tokens
        logits = model.lm_head(hidden[taught])
        loss = torch.nn.functional.cross_entropy(logits, tokens[rows][:, 1:][taught])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 4))
    torch.set_num_threads(threads)
    model.eval()
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(out)  # the job sets the parser's template itself
    (out / "taught.json").write_text(json.dumps({"losses": losses}))
    return out


def tool_job(path: Path, model: Path, run: Path, *, algorithm: dict | None = None, roles: dict | None = None, steps: int = 2) -> Path:
    """A multi-turn calculator job on one rank for `model`."""
    doc = {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "tools"},
        "spec": {
            "model": {"path": str(model), "dtype": "float32"},
            "data": TOOL_DATA,
            "algorithm": algorithm or {"name": "grpo"},
            "rollout": {"samplesPerPrompt": 4, **TOOL_ROLLOUT},
            "reward": {"rules": TOOL_REWARD},
            "roles": {"actor": {"replicas": 1, "gpusPerReplica": 1, "layout": {"dp": 1}}, **(roles or {})},
            "trainer": {
                "totalSteps": steps,
                "promptsPerStep": 2,
                "microBatchSize": 4,
                "seed": 3,
                "optimizer": {"lr": 1e-4},
                "checkpoint": {"path": str(run / "ckpt"), "interval": 100, "keep": 1},
                "exportPath": str(run / "final"),
            },
            "monitoring": {"enabled": False},
        },
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path

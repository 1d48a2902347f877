"""Multi-turn rollouts without vLLM: a scripted policy behind the rollout loop, SmolLM2's tokenizer."""

from __future__ import annotations

from typing import Callable

import pytest

from kuberl.engine.rollout.vllm_backend import Completion, Sampling


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    import transformers

    from kuberl.engine.models.loading import gguf_to_hf_folder, smollm2_gguf

    return transformers.AutoTokenizer.from_pretrained(gguf_to_hf_folder(smollm2_gguf()))


class ScriptedRollout:
    """vLLM's place in the loop: each prompt's continuation is `reply(prompt_text, turn)`, tokenized,
    then the stop token; `calls` records every generate (prompts and their limits)."""

    def __init__(self, tokenizer, reply: Callable[[str, int], str]):
        self.tokenizer, self.reply = tokenizer, reply
        self.calls: list[tuple[list[list[int]], list[int] | None]] = []

    def generate(self, prompts: list[list[int]], sampling: Sampling, max_new_tokens: list[int] | None = None) -> list[Completion]:
        self.calls.append((prompts, max_new_tokens))
        out = []
        for index, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            for sample in range(sampling.n):
                ids = self.tokenizer.encode(self.reply(text, sample), add_special_tokens=False)
                limit = max_new_tokens[index] if max_new_tokens else sampling.max_new_tokens
                cut = len(ids) + 1 > limit
                ids = ids[:limit] if cut else ids + [self.tokenizer.eos_token_id]
                out.append(Completion(index, ids, [-0.25] * len(ids), not cut))
        return out

    def prefix_cache_counters(self) -> tuple[int, int]:
        return 0, 0


@pytest.fixture
def tool_tokenizer_for_tools(smollm2_tokenizer):
    """SmolLM2's tokenizer with the hermes parser's template (its own describes no tools)."""
    from kuberl.engine.agents import parser_entry

    saved = smollm2_tokenizer.chat_template
    smollm2_tokenizer.chat_template = parser_entry("hermes").template
    yield smollm2_tokenizer
    smollm2_tokenizer.chat_template = saved

"""Conversations with tools as tokens: the prompt, and what joins one policy turn to the next.

The policy's own tokens are kept as it sampled them; only what the environment adds (tool results,
the template's tokens around them and the next generation prompt) is rendered by the chat template
and tokenized here. That continuation is the difference between the template's rendering of a
conversation that ends with an assistant message and of the same conversation with the new
messages and a generation prompt, plus whatever the template writes after an assistant message
beyond the stop token the policy ended its turn with (ChatML's newline after <|im_end|>). Rendered
once more as a whole, the conversation gives the same tokens (tests/test_agents_chat.py).
"""

from __future__ import annotations

from typing import Any

from ..config.termination import NotRetryable

_SENTINEL = "KUBERL_TURN_SENTINEL"
_PROBE = {
    "type": "function",
    "function": {"name": "kuberl_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


class TemplateError(NotRetryable, ValueError):
    """A chat template that cannot render multi-turn tool conversations; the message says why."""

    reason = "InvalidConfig"


def describes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows `tools` to the model and renders tool results."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "u"}], tools=[_PROBE], tokenize=False, add_generation_prompt=True)
        tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"},
                {"role": "tool", "name": "kuberl_probe_tool", "content": "r"},
            ],
            tools=[_PROBE],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:  # a template that raises on tools or on a tool message: it does not support them
        return False
    return "kuberl_probe_tool" in text


class ChatRenderer:
    """Token ids of tool conversations through the tokenizer's chat template (which must describe
    tools: rl.py sets the parser's template where the tokenizer's does not)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]]):
        self.tokenizer, self.tools = tokenizer, tools or None
        self._base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        closed = self.render(self._base, generation_prompt=False)
        if _SENTINEL not in closed:
            raise TemplateError("the chat template does not render an assistant message's content")
        self._after_assistant = closed[closed.rindex(_SENTINEL) + len(_SENTINEL) :]
        self._closed = closed
        self.continuation_ids([{"role": "tool", "name": "t", "content": "r"}], None)  # refuses a template it cannot follow, now

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, generation_prompt=True))

    def assistant_text(self, token_ids: list[int], stop_token: int | None) -> str:
        """The text of a policy's turn as its message's content (without the stop token that ended it)."""
        ids = token_ids[:-1] if stop_token is not None and token_ids and token_ids[-1] == stop_token else token_ids
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def continuation_ids(self, messages: list[dict[str, Any]], stop_token: int | None) -> list[int]:
        """The tokens after a policy's turn that ended with `stop_token`: the rest of the template's
        end of an assistant message, `messages` (tool results, ...) and the next generation prompt."""
        extended = self.render(self._base + list(messages), generation_prompt=True)
        if not extended.startswith(self._closed):
            raise TemplateError(
                "the chat template renders earlier messages differently once more follow; "
                "multi-turn rollouts need a template that only appends"
            )
        end = self._after_assistant
        if stop_token is not None:
            stop_text = self.tokenizer.decode([stop_token], skip_special_tokens=False)
            end = end[len(stop_text) :] if end.startswith(stop_text) else end
        return self.encode(end + extended[len(self._closed) :])

"""Prompt sets: reading jsonl and parquet files or generating the arithmetic set, chat templates,
and a seeded loader whose position is part of every checkpoint.

A bad record is an error that names the file and the line (jsonl) or row (parquet); nothing is
skipped silently.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..config.data import DataSpec, DatasetSource, GeneratorSpec
from ..config.termination import NotRetryable


class DataError(NotRetryable, ValueError):
    """A record or file that cannot be used; the message starts with file:line."""

    reason = "InvalidData"


@dataclass(frozen=True)
class Example:
    prompt: str | list[dict[str, str]]
    """Text, or chat messages [{role, content}, ...]."""
    answer: str | None = None
    chosen: str | None = None
    rejected: str | None = None
    where: str = ""
    """file:line of the record (or generator:index), for error messages."""


def arithmetic(spec: GeneratorSpec) -> list[Example]:
    """ "What is a + b?" (or a + b + c, ... for more operands) with the sum as the answer; the same
    list for the same seed."""
    rng = random.Random(spec.seed)
    out = []
    for i in range(spec.count):
        numbers = [rng.randint(0, spec.max_operand) for _ in range(spec.operands)]
        out.append(Example(prompt=f"What is {' + '.join(map(str, numbers))}?", answer=str(sum(numbers)), where=f"generator arithmetic:{i}"))
    return out


def _example(record: Any, where: str, data: DataSpec, preferences: bool) -> Example:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected an object with a {data.prompt_field!r} field, got {type(record).__name__}")
    if data.prompt_field not in record:
        raise DataError(f"{where}: no field {data.prompt_field!r} (data.promptField); fields: {', '.join(sorted(record)) or 'none'}")
    prompt = record[data.prompt_field]
    if isinstance(prompt, list):
        for message in prompt:
            if not (isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
                raise DataError(f"{where}: {data.prompt_field!r} is a list, so every item must be {{role: str, content: str}}")
    elif not isinstance(prompt, str) or not prompt:
        raise DataError(f"{where}: {data.prompt_field!r} must be a non-empty string or a list of chat messages")
    answer = record.get(data.answer_field)
    fields = {}
    if preferences:
        for attr, name in (("chosen", data.chosen_field or "chosen"), ("rejected", data.rejected_field or "rejected")):
            value = record.get(name)
            if not isinstance(value, str) or not value:
                raise DataError(f"{where}: dpo needs a non-empty string field {name!r}")
            fields[attr] = value
    return Example(prompt=prompt, answer=None if answer is None else str(answer), where=where, **fields)


def read_jsonl(path: Path, data: DataSpec, preferences: bool = False) -> list[Example]:
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
            out.append(_example(record, where, data, preferences))
    return out


def read_parquet(path: Path, data: DataSpec, preferences: bool = False) -> list[Example]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:
        raise DataError(f"{path}: not a readable parquet file: {exc}") from None
    return [_example(row, f"{path}:row {i}", data, preferences) for i, row in enumerate(rows)]


def load_examples(source: DatasetSource, data: DataSpec, base_dir: Path = Path("."), preferences: bool = False) -> list[Example]:
    """Every example of one source, in file order."""
    if source.generator is not None:
        return arithmetic(source.generator)
    assert source.path is not None
    path = Path(source.path).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    examples = (read_jsonl if source.inferred_format() == "jsonl" else read_parquet)(path, data, preferences)
    if not examples:
        raise DataError(f"{path}: no records")
    return examples


class PromptEncoder:
    """Turns an example's prompt into token ids, through the chat template when configured."""

    def __init__(self, tokenizer: Any, data: DataSpec, tools: list[dict[str, Any]] | None = None):
        """`tools`: the JSON schemas of the tools a multi-turn policy may call, which the chat
        template describes to the model (its `tools` variable)."""
        self.tokenizer, self.data, self.tools = tokenizer, data, tools or None

    def messages(self, example: Example) -> list[dict[str, str]]:
        messages = list(example.prompt) if isinstance(example.prompt, list) else [{"role": "user", "content": example.prompt}]
        if self.data.system_prompt is not None and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.data.system_prompt})
        return messages

    def text(self, example: Example) -> str:
        if not self.data.chat_template:
            if isinstance(example.prompt, list):
                raise DataError(f"{example.where}: chat messages need data.chatTemplate: true")
            return example.prompt
        return self.tokenizer.apply_chat_template(self.messages(example), tools=self.tools, tokenize=False, add_generation_prompt=True)

    def encode(self, example: Example) -> list[int]:
        ids = self.tokenizer.encode(self.text(example), add_special_tokens=not self.data.chat_template)
        if len(ids) > self.data.max_prompt_length:
            raise DataError(
                f"{example.where}: the prompt has {len(ids)} tokens, more than data.maxPromptLength = {self.data.max_prompt_length}"
            )
        return ids


class PromptLoader:
    """Batches of examples in a seeded order that is reshuffled every epoch.

    Its whole state is (epoch, position): saved in checkpoints, so a resumed run sees exactly the
    batches the uninterrupted run would have seen.
    """

    def __init__(self, examples: Sequence[Example], batch_size: int, seed: int, shuffle: bool = True):
        if batch_size > len(examples):
            raise DataError(f"trainer.promptsPerStep = {batch_size} is more than the {len(examples)} training prompts")
        self.examples, self.batch_size, self.seed, self.shuffle = list(examples), batch_size, seed, shuffle
        self.epoch, self.position = 0, 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[Example]:
        """The next batch; a batch never spans two epochs (the remainder of an epoch is dropped)."""
        if self.position + self.batch_size > len(self.examples):
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order(self.epoch)
        batch = [self.examples[i] for i in order[self.position : self.position + self.batch_size]]
        self.position += self.batch_size
        return batch

    @property
    def steps_per_epoch(self) -> int:
        return len(self.examples) // self.batch_size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

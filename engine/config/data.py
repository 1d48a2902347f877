"""Prompt sets: files in jsonl or parquet, or a seeded generator for the arithmetic demo."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import LocalPath, Rule, SpecModel, pattern

DataFormat = Literal["jsonl", "parquet"]

# Suffixes from which the format is inferred when `format` is left out.
FORMAT_BY_SUFFIX: dict[str, DataFormat] = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_SUFFIX_CEL = " || ".join(f"self.path.endsWith('{s}')" for s in FORMAT_BY_SUFFIX)


class GeneratorSpec(SpecModel):
    """A prompt set made on the fly, the same for the same seed."""

    name: Literal["arithmetic"]
    """arithmetic: "What is a + b?" (more operands: "What is a + b + c?") with the sum as the answer."""
    count: int = Field(default=1000, ge=1, le=10_000_000)
    """How many prompts."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Seed of the generator; the validation set should use another seed than the training set."""
    max_operand: int = Field(default=50, ge=1, le=10**9)
    """Operands are drawn from 0..maxOperand."""
    operands: int = Field(default=2, ge=2, le=16)
    """Numbers per sum (three-number sums are where a small model starts to need a calculator)."""


class DatasetSource(SpecModel):
    """A file of prompts, or a generator."""

    path: LocalPath | None = None
    """A local .jsonl or .parquet file, one prompt per line or row."""
    format: DataFormat | None = None
    """The file's format; inferred from the suffix (.jsonl, .json, .parquet) when left out."""
    generator: GeneratorSpec | None = None
    """Generate the prompts instead of reading a file."""

    RULES = (
        Rule(
            message="set exactly one of path and generator",
            check=lambda s: (s.path is None) != (s.generator is None),
            cel="has(self.path) != has(self.generator)",
        ),
        Rule(
            message="format applies only to path",
            check=lambda s: s.format is None or s.path is not None,
            cel="!has(self.format) || has(self.path)",
            field="format",
        ),
        Rule(
            message="cannot infer the format from the file's suffix: set format (jsonl or parquet)",
            check=lambda s: s.path is None or s.format is not None or s.inferred_format() is not None,
            cel=f"!has(self.path) || has(self.format) || {_SUFFIX_CEL}",
            field="path",
        ),
    )

    def inferred_format(self) -> DataFormat | None:
        if self.format is not None:
            return self.format
        for suffix, fmt in FORMAT_BY_SUFFIX.items():
            if self.path is not None and self.path.endswith(suffix):
                return fmt
        return None


FIELD_NAME = pattern(r"^[A-Za-z_][A-Za-z0-9_.-]*$", "a field name: letters, digits, '_', '.' and '-', not starting with a digit")


def _same_source(a: DatasetSource, b: DatasetSource) -> bool:
    return (a.path is not None and a.path == b.path) or (a.generator is not None and a.generator == b.generator)


class DataSpec(SpecModel):
    """What to train on."""

    train: DatasetSource
    """The training prompts (preference pairs for dpo)."""
    validation: DatasetSource | None = None
    """Held-out prompts, scored every trainer.validationInterval steps."""
    prompt_field: str = Field(default="prompt", min_length=1, max_length=256, pattern=FIELD_NAME)
    """The field that holds the prompt (a string, or a list of chat messages)."""
    answer_field: str = Field(default="answer", min_length=1, max_length=256, pattern=FIELD_NAME)
    """The field that holds the reference answer that rule rewards compare against."""
    chosen_field: str | None = Field(default=None, min_length=1, max_length=256, pattern=FIELD_NAME)
    """dpo: the field that holds the preferred response."""
    rejected_field: str | None = Field(default=None, min_length=1, max_length=256, pattern=FIELD_NAME)
    """dpo: the field that holds the dispreferred response."""
    max_prompt_length: int = Field(default=512, ge=1, le=1_048_576)
    """Prompts longer than this many tokens are an error when read."""
    chat_template: bool = True
    """Wrap each prompt in the tokenizer's chat template."""
    system_prompt: str | None = Field(default=None, max_length=65536)
    """A system message put before every prompt when the chat template is used."""
    shuffle: bool = True
    """Shuffle the training prompts every epoch (seeded by trainer.seed)."""

    RULES = (
        Rule(
            message="systemPrompt needs chatTemplate: true",
            check=lambda s: s.system_prompt is None or s.chat_template,
            cel="!has(self.systemPrompt) || self.chatTemplate",
            field="systemPrompt",
        ),
        Rule(
            message="chosenField and rejectedField must differ",
            check=lambda s: s.chosen_field is None or s.chosen_field != s.rejected_field,
            cel="!has(self.chosenField) || !has(self.rejectedField) || self.chosenField != self.rejectedField",
            field="rejectedField",
        ),
        Rule(
            message="validation is the training set itself: give held-out prompts (another file, or the generator with another seed)",
            check=lambda s: s.validation is None or not _same_source(s.validation, s.train),
            # CEL cannot compare the two objects (their schemas are distinct types), so field by field.
            cel="!has(self.validation) || !("
            "(has(self.validation.path) && has(self.train.path) && self.validation.path == self.train.path)"
            " || (has(self.validation.generator) && has(self.train.generator)"
            + "".join(f" && self.validation.generator.{f} == self.train.generator.{f}" for f in ("name", "count", "seed", "maxOperand"))
            + " && (has(self.validation.generator.operands) ? self.validation.generator.operands : 2)"
            " == (has(self.train.generator.operands) ? self.train.generator.operands : 2)" + "))",
            field="validation",
        ),
    )

"""Prompt sets: jsonl and parquet files or the arithmetic generator, chat templates, and the seeded order
in which a job walks them (prompts.py)."""

from .prompts import DataError, Example, PromptEncoder, PromptLoader, arithmetic, load_examples, read_jsonl, read_parquet

__all__ = ["DataError", "Example", "PromptEncoder", "PromptLoader", "arithmetic", "load_examples", "read_jsonl", "read_parquet"]

"""The registries behind the engine's extension points (estimators, losses, presets, steps, tools, parsers,
environments, sandbox backends, trackers, model families): a dict of named entries that refuses a name
registered twice and names the known ones when asked for an unknown one."""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E")


class Registry(dict[str, E]):
    """Named entries of one kind. `registry[name] = entry` raises ValueError when `name` is there already (two
    files registering one name is a mistake, not an override); `registry[name]` of an unknown name raises
    KeyError listing the known ones. Otherwise a dict: iterate it, test `in`, read `.items()`."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        """What an entry is, in the messages: "tool-call parser", "advantage estimator", ..."""

    def __setitem__(self, name: str, entry: E) -> None:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        super().__setitem__(name, entry)

    def __missing__(self, name: str) -> E:
        raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}")

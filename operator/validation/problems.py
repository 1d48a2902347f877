"""What is wrong with a manifest, as records: where (file, field) and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: where it is and what rule it breaks."""

    source: str
    """The file (with file:line where the YAML itself is at fault), and the document's number when the file holds several."""
    path: str
    """The field, e.g. spec.roles.actor.layout; empty for the document as a whole."""
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.message}" if self.path else f"{self.source}: {self.message}"


class ManifestError(Exception):
    """A manifest that cannot be used; `problems` lists every reason found."""

    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


class NoRLJob(ManifestError):
    """A file that holds no RLJob at all (a claim, a kustomization, ...): `kinds` are what it holds instead."""

    def __init__(self, problems: list[Problem], kinds: list[str]):
        super().__init__(problems)
        self.kinds = kinds


def format_path(loc: tuple[object, ...]) -> str:
    """("spec", "roles", "actor", "tolerations", 0) -> "spec.roles.actor.tolerations[0]"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part.isascii():
            out += f".{part}" if out else part
        else:
            out += f"[{part}]"
    return out

"""The manifests the tests check: the examples and the good and bad corpora under tests/manifests."""

from __future__ import annotations

import re
from pathlib import Path

# The examples that `kuberl run` runs on one machine, reading its own files; the others are for a cluster.
LOCAL_EXAMPLES = frozenset(
    {"grpo-smollm2-arith.yaml", "grpo-async.yaml", "dpo.yaml", "agent-calculator.yaml", "agent-calculator-sandbox.yaml"}
)


def rljob_files(folder: Path) -> list[Path]:
    """The YAML files under `folder` that hold an RLJob (the examples also ship claims and overlays)."""
    return sorted(p for p in folder.rglob("*.yaml") if re.search(r"^kind: RLJob$", p.read_text(), re.M))


def for_local_run(path: Path) -> bool:
    """Whether a manifest is meant for `kuberl run` (its paths are the machine's) rather than a cluster."""
    if path.parent.name in ("good", "bad"):
        return bool(re.search(r"^# target: local", path.read_text(), re.M))
    return path.name in LOCAL_EXAMPLES

"""The StepRun protocol (engine/steps/run_view.py) is the contract between the steps and the runner:
every member it names is RLRun's, and the steps reach the run through nothing else. Read from the
source, as no type checker runs here."""

from __future__ import annotations

import ast
from pathlib import Path

from kuberl.engine.steps.run_view import StepRun

ENGINE = Path(__file__).resolve().parent.parent / "engine"


def _protocol_members() -> set[str]:
    methods = {name for name, value in vars(StepRun).items() if callable(value) and not name.startswith("_")}
    return set(StepRun.__annotations__) | methods


def test_every_member_of_the_protocol_is_the_runs() -> None:
    tree = ast.parse((ENGINE / "runtime" / "rl.py").read_text())
    [run_class] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "RLRun"]
    assigned = {
        target.attr
        for node in ast.walk(run_class)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for each in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for target in (each.elts if isinstance(each, ast.Tuple) else [each])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }
    methods = {node.name for node in run_class.body if isinstance(node, ast.FunctionDef)}
    assert _protocol_members() - assigned - methods == set()


def test_the_steps_use_nothing_of_the_run_that_the_protocol_does_not_name() -> None:
    def is_run(node: ast.AST) -> bool:  # `run`, `self.run` or `ctx.run`
        return (isinstance(node, ast.Name) and node.id == "run") or (isinstance(node, ast.Attribute) and node.attr == "run")

    used = {
        node.attr: path.name
        for path in (ENGINE / "steps").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and is_run(node.value)
    }
    assert len(used) > 15  # the scan finds the steps' uses
    assert {name: where for name, where in used.items() if name not in _protocol_members()} == {}

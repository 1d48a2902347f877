"""The registry of model families (engine/models/families/): every family file is registered, reads its own example
config, refuses what it says it refuses, splits the way it says, and names tests that exist. No torch, no weights:
the equality itself is in the tests each family names (tests/engine/test_megatron.py, tests/engine/test_moe.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kuberl.engine.models.arch import LlamaArch, UnsupportedModel, YarnScaling
from kuberl.engine.models.families import FAMILIES, ModelFamily, family_of, supported_model_types

REPO = Path(__file__).resolve().parent.parent
FOLDER = REPO / "engine" / "models" / "families"


def test_every_family_file_is_registered_once() -> None:
    files = sorted(p.stem for p in FOLDER.glob("*.py") if p.stem not in ("__init__", "registry"))
    assert files == sorted(FAMILIES), "one file per family, named after the family it registers"
    assert set(files) >= {"llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "mixtral"}
    for name, family in FAMILIES.items():
        assert family.name == name and family.model_types, name
        assert all(family_of(t) is family for t in family.model_types)


def test_an_unknown_model_type_is_refused_naming_every_supported_one() -> None:
    with pytest.raises(UnsupportedModel) as refused:
        LlamaArch.from_hf_config({"model_type": "gemma2"})
    message = str(refused.value)
    assert "\n" not in message and "model_type 'gemma2' is not a supported model family" in message
    assert message.endswith(f"(supported: {', '.join(supported_model_types())})")
    assert all(t in message for f in FAMILIES.values() for t in f.model_types)


def _declared(node_id: str) -> tuple[Path, str, str | None]:
    match = re.fullmatch(r"([^:]+)::(\w+)(?:\[([\w.-]+)\])?", node_id)
    assert match, f"{node_id!r} is not path::function[parameter]"
    path, function, parameter = match.groups()
    return REPO / path, function, parameter


def _strings_around(function: ast.FunctionDef, functions: dict[str, ast.FunctionDef]) -> set[str]:
    """The string constants of a test's decorators and body, and of the fixtures it takes (defined in its file)."""
    nodes: list[ast.AST] = [*function.decorator_list, *function.body]
    nodes += [functions[a.arg] for a in function.args.args if a.arg in functions]
    return {c.value for node in nodes for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}


def _parametrized_over_the_registry(function: ast.FunctionDef) -> bool:
    """A test whose parametrize decorator reads FAMILIES itself: each family is a case of it by its name."""
    return any(isinstance(n, ast.Name) and n.id == "FAMILIES" for d in function.decorator_list for n in ast.walk(d))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_tests_a_family_names_exist(name: str) -> None:
    family = FAMILIES[name]
    assert family.tests, f"family {name} names no test that proves megatron-core computes what transformers does"
    for node_id in family.tests:
        path, function, parameter = _declared(node_id)
        assert path.is_file(), f"{name}: {node_id}: no file {path.relative_to(REPO)}"
        functions = {n.name: n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert function in functions, f"{name}: {node_id}: {path.name} has no function {function}"
        if parameter is not None and not (parameter == name and _parametrized_over_the_registry(functions[function])):
            # the family's case: a value the test is parametrized with, or its fixture's key
            assert parameter in _strings_around(functions[function], functions), (
                f"{name}: {node_id}: {function} is not parametrized with, nor reads, {parameter!r}"
            )


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_reads_its_example_as_it_declares(name: str) -> None:
    family = FAMILIES[name]
    arch = LlamaArch.from_hf_config(family.example)
    assert family.example["model_type"] in family.model_types
    assert (arch.qkv_bias, arch.qk_norm, arch.is_moe) == (family.qkv_bias, family.qk_norm, family.is_moe)
    assert not family.is_moe or arch.num_experts > 0 and arch.experts_per_token > 0


def _splits(arch: LlamaArch, tp: int = 1, pp: int = 1, ep: int = 1) -> bool:
    try:
        arch.check_layout(tp, pp, ep)
    except UnsupportedModel:
        return False
    return True


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_layout_check_allows_what_the_family_declares(name: str) -> None:
    """Each example splits by 2 evenly (heads, layers, experts, vocabulary), so a refusal at 2 is the family's rule."""
    family = FAMILIES[name]
    arch = LlamaArch.from_hf_config(family.example)
    declared = family.parallelism
    assert (_splits(arch, tp=2), _splits(arch, pp=2), _splits(arch, ep=2)) == (declared.tp, declared.pp, declared.ep)


@pytest.mark.parametrize(("name", "field"), [(f.name, r.field) for f in FAMILIES.values() for r in f.refusals])
def test_a_family_refuses_what_it_says_by_name(name: str, field: str) -> None:
    family: ModelFamily = FAMILIES[name]
    refusal = next(r for r in family.refusals if r.field == field)
    with pytest.raises(UnsupportedModel, match=rf"^{family.example['model_type']} with {field}=.* is not supported: "):
        LlamaArch.from_hf_config({**family.example, field: refusal.example})


def test_a_window_as_long_as_the_context_is_not_refused() -> None:
    mistral = FAMILIES["mistral"].example
    assert LlamaArch.from_hf_config({**mistral, "sliding_window": mistral["max_position_embeddings"]}).num_layers == 4


def test_rope_scaling_is_the_family_s_to_accept() -> None:
    llama = FAMILIES["llama"].example
    assert LlamaArch.from_hf_config(llama).rope_scaling_factor == 8.0
    with pytest.raises(UnsupportedModel, match=r"'dynamic' is not supported \(supported: default, llama3, linear, yarn\)"):
        LlamaArch.from_hf_config({**llama, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})
    # YaRN's pretraining context defaults to the config's max_position_embeddings, as transformers defaults it.
    yarn = LlamaArch.from_hf_config({**llama, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}).rope_scaling
    assert yarn == YarnScaling(4.0, llama["max_position_embeddings"])


def test_a_job_runs_the_families_without_a_job_refusal() -> None:
    from kuberl.engine.config.topology import EngineConfig
    from kuberl.engine.models.support import check_model

    config = EngineConfig.model_validate(
        {
            "job": "j",
            "worldSize": 1,
            "masterPort": 29500,
            "model": {"path": "/m"},
            "data": {"train": {"path": "d.jsonl"}},
            "algorithm": {"name": "grpo"},
            "reward": {"rules": [{"name": "math_answer"}]},
            "trainer": {"totalSteps": 1},
            "roles": {"actor": {"ranks": 1, "rankOffset": 0, "procsPerPod": 1, "layout": {"dp": 1}}},
        }
    )
    for family in FAMILIES.values():
        if family.job_refusal is None:
            assert check_model(family.example, config).vocab_size == family.example["vocab_size"]
        else:
            with pytest.raises(UnsupportedModel, match=re.escape(family.job_refusal)):
                check_model(family.example, config)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_tiny_config_of_a_family_is_that_family_at_the_tiny_shape(name: str) -> None:
    """engine/models/tiny.py makes a checkpoint of any family from its example (tests/rl/test_family_steps.py)."""
    from kuberl.engine.models.tiny import tiny_config

    family = FAMILIES[name]
    config = tiny_config(name)
    arch = LlamaArch.from_hf_config(config)
    assert config["model_type"] == family.example["model_type"]
    assert (arch.qkv_bias, arch.qk_norm, arch.is_moe) == (family.qkv_bias, family.qk_norm, family.is_moe)
    assert (arch.num_layers, arch.hidden_size, arch.head_dim) == (2, 128, 64)  # heads of 64: vLLM's CPU attention
    assert arch.rope_scaling is None or arch.rope_scaling_factor == 1.0
    with pytest.raises(ValueError, match="no model family 'gemma2'"):
        tiny_config("gemma2")

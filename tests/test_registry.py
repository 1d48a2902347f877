"""The registries behind the engine's extension points share one type: a name twice is refused, an unknown
name is answered with the known ones, and every registry of the engine is one."""

from __future__ import annotations

import pytest

from kuberl.engine.common.registry import Registry


def test_a_name_registered_twice_is_refused_and_the_first_entry_stays() -> None:
    tools: Registry[int] = Registry("built-in tool")
    tools["calculator"] = 1
    with pytest.raises(ValueError, match="built-in tool 'calculator' is registered twice"):
        tools["calculator"] = 2
    assert tools["calculator"] == 1 and dict(tools) == {"calculator": 1}


def test_an_unknown_name_lists_the_known_ones_and_get_and_in_stay_quiet() -> None:
    losses: Registry[str] = Registry("policy loss")
    losses["ppo_clip"], losses["gspo"] = "a", "b"
    with pytest.raises(KeyError, match="unknown policy loss 'ppo' ; known: gspo, ppo_clip".replace(" ;", ";")):
        losses["ppo"]
    assert losses.get("ppo") is None and "ppo" not in losses and sorted(losses) == ["gspo", "ppo_clip"]


def test_every_registry_of_the_engine_is_a_registry() -> None:
    from kuberl.engine.agents.environments import ENVIRONMENTS
    from kuberl.engine.agents.parsers import PARSERS
    from kuberl.engine.agents.sandbox import SANDBOX_BACKENDS
    from kuberl.engine.agents.tools import BUILTIN_TOOLS, TOOL_KINDS
    from kuberl.engine.algorithms.presets.registry import PRESETS
    from kuberl.engine.algorithms.registry import ADVANTAGES, POLICY_LOSSES
    from kuberl.engine.models.families import FAMILIES
    from kuberl.engine.steps.registry import STEPS
    from kuberl.engine.tracking import mlflow_tracker, tensorboard_tracker, wandb_tracker  # noqa: F401  (registered on first use)
    from kuberl.engine.tracking.registry import TRACKERS

    registries = [
        ENVIRONMENTS,
        PARSERS,
        SANDBOX_BACKENDS,
        BUILTIN_TOOLS,
        TOOL_KINDS,
        PRESETS,
        ADVANTAGES,
        POLICY_LOSSES,
        FAMILIES,
        STEPS,
        TRACKERS,
    ]
    assert all(isinstance(r, Registry) and len(r) > 0 for r in registries)
    assert len({r.kind for r in registries}) == len(registries)  # each names its own kind in its messages


def test_a_model_family_registered_again_is_refused_as_twice_and_a_taken_model_type_as_taken() -> None:
    import dataclasses

    from kuberl.engine.models.families import FAMILIES
    from kuberl.engine.models.families.registry import register_family

    llama = FAMILIES["llama"]
    with pytest.raises(ValueError, match="model family 'llama' is registered twice"):
        register_family(llama)
    with pytest.raises(ValueError, match="model_type 'llama' of family 'llama_again' is already family 'llama''s"):
        register_family(dataclasses.replace(llama, name="llama_again"))
    assert "llama_again" not in FAMILIES and FAMILIES["llama"] is llama

"""Algorithm plug-ins: the example registers a working estimator; broken ones are refused by file and function."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kuberl.engine import algorithms as A
from kuberl.engine.runtime.plugins import PluginError, load_plugins

EXAMPLE = Path(__file__).parent.parent / "examples" / "plugins" / "median_baseline.py"
LOSS_EXAMPLE = EXAMPLE.parent / "soft_clip.py"
PRESET_EXAMPLE = EXAMPLE.parent / "rloo_dro.py"


def test_the_example_plugin_registers_an_estimator_with_hand_computed_values() -> None:
    assert "median_baseline" in load_plugins([EXAMPLE]) or "median_baseline" in A.ADVANTAGES
    assert len(EXAMPLE.read_text().splitlines()) < 30
    entry = A.advantage_estimator("median_baseline")
    assert entry.min_samples == 2 and entry.options == {"scale": 1.0}
    # Group 0: scores 1, 0, 5 -> median 1; group 1: 2, 4 -> torch's median is the lower middle, 2.
    inputs = A.AdvantageInputs(scores=torch.tensor([1.0, 0.0, 5.0, 2.0, 4.0]), group=torch.tensor([0, 0, 0, 1, 1]), mask=torch.ones(5, 1))
    out = entry.fn(inputs, scale=2.0).advantages[:, 0]
    assert torch.equal(out, torch.tensor([0.0, -2.0, 8.0, 0.0, 4.0]))


def test_the_example_loss_plugin_registers_a_loss_with_hand_computed_values() -> None:
    load_plugins([LOSS_EXAMPLE])
    assert len(LOSS_EXAMPLE.read_text().splitlines()) < 30
    entry = A.policy_loss_entry("soft_clip")
    assert entry.options == {"width": 0.2, "aggregation": "token_mean"}
    # Ratios 1 and e^1 (width 0.5): soft ratios 1 and 1 + 0.5·tanh((e - 1) / 0.5); A = 1 and 2, token mean.
    logp = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss, _ = entry.fn(A.LossInputs(logp, torch.zeros(1, 2), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2)), width=0.5)
    soft = 1 + 0.5 * math.tanh((math.e - 1) / 0.5)
    assert float(loss.detach()) == pytest.approx(-(1.0 + 2.0 * soft) / 2)


def test_the_example_preset_plugin_registers_a_preset_of_built_in_entries() -> None:
    from kuberl.engine.config.algorithm import AlgorithmSpec

    load_plugins([PRESET_EXAMPLE])
    assert len(PRESET_EXAMPLE.read_text().splitlines()) < 30
    spec = AlgorithmSpec.model_validate({"name": "rloo_dro", "plugins": [{"path": str(PRESET_EXAMPLE)}]})
    choice = A.choice_of(spec)
    assert (choice.advantage, choice.policy_loss, choice.policy_loss_options, choice.step) == (
        "rloo",
        "dro",
        {"beta": 0.05, "aggregation": "token_mean"},
        "on_policy",
    )
    # The API knows the preset only once plug-ins are set.
    with pytest.raises(ValueError, match="unknown preset"):
        AlgorithmSpec.model_validate({"name": "rloo_dro"})


def test_a_plugin_preset_must_name_registered_entries(tmp_path: Path) -> None:
    path = tmp_path / "bad_preset.py"
    path.write_text(
        "from kuberl.engine.algorithms import register_preset\n"
        "register_preset('nowhere', summary='x', advantage='no_such_estimator', policy_loss='ppo_clip')\n"
    )
    with pytest.raises(PluginError, match="preset nowhere names the advantage estimator 'no_such_estimator'"):
        load_plugins([path])
    assert "nowhere" not in A.PRESETS


def test_the_engine_refuses_an_option_that_compares_samples_with_one_sample() -> None:
    from kuberl.engine.config.algorithm import AlgorithmSpec
    from kuberl.engine.runtime.algorithm_checks import ConfigError, check_algorithm

    for raw in (
        {"name": "grpo", "advantage": {"name": "reinforce_pp", "options": {"baseline": True}}},
        {"name": "reinforce_pp", "reinforcePp": {"baseline": True}},
    ):
        spec = AlgorithmSpec.model_validate(raw)
        check_algorithm(spec, samples=2, tis=False)
        with pytest.raises(ConfigError, match="reinforce_pp's baseline compares a prompt's samples"):
            check_algorithm(spec, samples=1, tis=False)
    check_algorithm(AlgorithmSpec(name="reinforce_pp"), samples=1, tis=False)  # the default follows the samples


def test_loading_the_same_file_twice_registers_once() -> None:
    load_plugins([EXAMPLE])
    assert load_plugins([EXAMPLE]) == []


BAD = {
    "import_fails.py": ("import no_such_module_here\n", "importing {path} failed: ModuleNotFoundError"),
    "option_without_default.py": (
        "from kuberl.engine.algorithms import Advantages, register_advantage\n"
        "@register_advantage('needs_option', summary='x')\n"
        "def needs_option(inputs, width):\n    return Advantages(inputs.mask)\n",
        "{path}: function needs_option: options need defaults (width)",
    ),
    "returns_nan.py": (
        "import torch\nfrom kuberl.engine.algorithms import Advantages, register_advantage\n"
        "@register_advantage('nan_adv', summary='x')\n"
        "def nan_adv(inputs):\n    return Advantages(inputs.mask * float('nan'))\n",
        "{path}: function nan_adv returned NaN or infinite advantages",
    ),
    "loss_old_signature.py": (
        "from kuberl.engine.algorithms import register_policy_loss\n"
        "@register_policy_loss('four_tensors', summary='x')\n"
        "def four_tensors(logprobs, old_logprobs, advantages, mask, clip=0.2):\n    return (-advantages * logprobs).mean(), {}\n",
        "{path}: function four_tensors must take one argument, a LossInputs record",
    ),
    "wrong_shape.py": (
        "from kuberl.engine.algorithms import Advantages, register_advantage\n"
        "@register_advantage('per_sequence', summary='x')\n"
        "def per_sequence(inputs):\n    return Advantages(inputs.scores)\n",
        "{path}: function per_sequence returned advantages of shape (4,); they must be per token, (4, 3)",
    ),
    "loss_not_scalar.py": (
        "from kuberl.engine.algorithms import register_policy_loss\n"
        "@register_policy_loss('per_token_loss', summary='x')\n"
        "def per_token_loss(inputs):\n    return -inputs.advantages * inputs.logprobs, {}\n",
        "{path}: function per_token_loss must return a finite scalar loss, got shape (4, 3)",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_broken_plugin_is_refused_naming_file_and_function(tmp_path: Path, name: str) -> None:
    source, message = BAD[name]
    path = tmp_path / name
    path.write_text(source)
    with pytest.raises(PluginError) as caught:
        load_plugins([path])
    assert message.format(path=path) in str(caught.value)


def test_a_missing_plugin_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match="does not exist"):
        load_plugins([tmp_path / "absent.py"])


def test_a_refused_plugin_leaves_nothing_registered(tmp_path: Path) -> None:
    path = tmp_path / "half.py"
    path.write_text(BAD["returns_nan.py"][0])
    with pytest.raises(PluginError):
        load_plugins([path])
    assert "nan_adv" not in A.ADVANTAGES


def test_a_plugin_step_is_registered_and_one_with_the_wrong_signature_refused(tmp_path: Path) -> None:
    from kuberl.engine.steps import STEPS

    good = tmp_path / "my_step.py"
    good.write_text(
        "from kuberl.engine.steps import register_step\n"
        "@register_step('twice_sampled', summary='x')\n"
        "def twice_sampled(ctx):\n    ctx.record.add(custom=1.0)\n"
    )
    assert load_plugins([good]) == ["twice_sampled"] and STEPS["twice_sampled"].on_policy
    bad = tmp_path / "bad_step.py"
    bad.write_text(
        "from kuberl.engine.steps import register_step\n@register_step('two_args', summary='x')\ndef two_args(ctx, extra):\n    pass\n"
    )
    with pytest.raises(PluginError, match=f"{bad}: function two_args must take one argument, the StepContext"):
        load_plugins([bad])
    assert "two_args" not in STEPS


def _engine_config(tmp_path: Path, algorithm: dict, samples: int = 4):
    import yaml

    from kuberl.operator.cli.local_run import load_one
    from kuberl.operator.control.planner import engine_config

    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kuberl.dev/v1alpha1",
                "kind": "RLJob",
                "metadata": {"name": "j"},
                "spec": {
                    "model": {"path": str(tmp_path)},
                    "data": {"train": {"generator": {"name": "arithmetic", "count": 8}}},
                    "algorithm": algorithm,
                    "rollout": {"samplesPerPrompt": samples},
                    "reward": {"rules": [{"name": "math_answer"}]},
                    "roles": {"actor": {"replicas": 1}},
                    "trainer": {"totalSteps": 1, "promptsPerStep": 2},
                },
            }
        )
    )
    return engine_config(load_one(job))


@pytest.mark.parametrize(
    "algorithm,samples,message",
    [
        (
            {"name": "grpo", "step": {"name": "no_such_step"}, "plugins": [{"path": str(EXAMPLE)}]},
            4,
            "algorithm.step.name: 'no_such_step' is not registered (known: dpo, dynamic_sampling, on_policy",
        ),
        (
            {"name": "reinforce_pp", "reinforcePp": {"baseline": False}, "step": {"name": "dynamic_sampling"}},
            1,
            "dynamic sampling keeps groups whose samples' rewards differ",
        ),
    ],
)
def test_the_engine_refuses_a_step_it_cannot_run(tmp_path: Path, algorithm: dict, samples: int, message: str) -> None:
    from kuberl.engine.runtime.checks import ConfigError, check_supported

    config = _engine_config(tmp_path, algorithm, samples)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_supported(config)


def test_a_job_that_samples_is_refused_a_step_that_trains_on_given_pairs(tmp_path: Path) -> None:
    from kuberl.engine.runtime.checks import ConfigError, check_supported

    plugin = tmp_path / "pairs_step.py"
    plugin.write_text(
        "from kuberl.engine.steps import register_step\n"
        "@register_step('pairs_only', summary='x', on_policy=False)\n"
        "def pairs_only(ctx):\n    pass\n"
    )
    config = _engine_config(tmp_path, {"name": "grpo", "step": {"name": "pairs_only"}, "plugins": [{"path": str(plugin)}]})
    with pytest.raises(ConfigError, match="algorithm.step.name: pairs_only trains on preference pairs: it is dpo's step"):
        check_supported(config)

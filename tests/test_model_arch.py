"""Which rope a Hugging Face config asks for, and what the engine refuses, before any weight loads.
Megatron-core against transformers with llama3, linear and YaRN scaling: tests/engine/test_megatron.py."""

from __future__ import annotations

import re

import pytest

from kuberl.engine.models.arch import LinearScaling, UnsupportedModel, YarnScaling, read_rope_scaling, rope_scaling_factor

LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_plain_rope_has_no_factor() -> None:
    assert rope_scaling_factor({}) is None
    assert rope_scaling_factor({"rope_type": "default", "rope_theta": 500000.0}) is None  # transformers 5's rope_parameters


@pytest.mark.parametrize(
    "scaling,factor",
    [
        (LLAMA31, 8.0),
        ({**LLAMA31, "factor": 32.0}, 32.0),  # Llama 3.1/3.3, and 3.2
        ({**LLAMA31, "rope_theta": 500000.0}, 8.0),  # as transformers 5 writes it
        ({**{k: v for k, v in LLAMA31.items() if k != "rope_type"}, "type": "llama3"}, 8.0),
    ],
)  # the older key
def test_llama3_scaling_is_read(scaling: dict, factor: float) -> None:
    assert rope_scaling_factor(scaling) == factor


def test_llama3_scaling_that_leaves_a_number_out_is_refused() -> None:
    # Left out, transformers takes max_position_embeddings for the original context where megatron-core takes 8192.
    for left_out in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"):
        with pytest.raises(
            UnsupportedModel, match=f"llama3 rope_scaling without {left_out} is not supported: every Llama 3.1-3.3 config names them"
        ):
            read_rope_scaling({k: v for k, v in LLAMA31.items() if k != left_out})


def test_linear_and_yarn_scaling_are_read_into_their_records() -> None:
    assert read_rope_scaling({"rope_type": "linear", "factor": 4.0}) == LinearScaling(4.0)
    assert read_rope_scaling({"type": "linear", "factor": 2.0, "rope_theta": 1e4}) == LinearScaling(2.0)
    qwen3 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # Qwen3's long-context recipe
    assert read_rope_scaling(qwen3, max_position_embeddings=131072) == YarnScaling(4.0, 32768)
    assert rope_scaling_factor(qwen3) == 4.0
    # transformers' order for the pretraining context: the config's top-level key, rope_scaling's, max_position_embeddings.
    assert read_rope_scaling({**qwen3, "original_max_position_embeddings": None}, max_position_embeddings=40960) == YarnScaling(4.0, 40960)
    assert read_rope_scaling(qwen3, original_max_position_embeddings=4096).original_max_position_embeddings == 4096
    # transformers and vLLM take mscale over mscale_all_dim only where both are set and non-zero (DeepSeek's).
    deepseek = read_rope_scaling({**qwen3, "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 16, "truncate": False})
    assert deepseek == YarnScaling(4.0, 32768, beta_fast=16.0, mscale=0.707, mscale_all_dim=0.707, truncate=False)
    assert read_rope_scaling({**qwen3, "mscale": 0.707}) == YarnScaling(4.0, 32768)  # mscale 1 over 0: get_mscale(factor)


@pytest.mark.parametrize(
    "scaling,words",
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic' is not supported (supported: default, llama3, linear, yarn)"),
        ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [4.0]}, "'longrope' is not supported"),
        ({"rope_type": "ntk", "factor": 2.0}, "'ntk' is not supported"),
        ({**LLAMA31, "original_max_position_embeddings": 4096}, "original_max_position_embeddings"),
        ({**LLAMA31, "low_freq_factor": 2.0}, "low_freq_factor"),
        ({**LLAMA31, "factor": 0.5}, "at least 1"),
        ({"rope_type": "linear", "factor": 0.5}, "linear rope_scaling factor 0.5 is not supported: it must be a number of at least 1"),
        ({"rope_type": "linear"}, "linear rope_scaling without a factor"),
        ({"rope_type": "linear", "factor": 4}, "vLLM takes it only as a float (write 4.0)"),
        ({"rope_type": "yarn", "factor": 4.0}, "yarn rope_scaling with original_max_position_embeddings=None"),
        (
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, "attention_factor": 1.2},
            "attention_factor=1.2 is not supported: megatron-core derives it",
        ),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, "beta_fast": None}, "beta_fast=None"),
    ],
)
def test_anything_megatron_core_would_compute_otherwise_is_refused(scaling: dict, words: str) -> None:
    with pytest.raises(UnsupportedModel, match=re.escape(words)):
        rope_scaling_factor(scaling)


QWEN3_06B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_sliding_window": False,
}


def test_qwen3_is_read_with_its_qk_norms_and_its_own_head_size() -> None:
    from kuberl.engine.models.arch import LlamaArch

    arch = LlamaArch.from_hf_config(QWEN3_06B)  # Qwen3-0.6B's config.json
    assert arch.qk_norm and not arch.qkv_bias and arch.head_dim == 128 and arch.num_heads * arch.head_dim != arch.hidden_size
    assert not LlamaArch.from_hf_config({**QWEN3_06B, "model_type": "qwen2"}).qk_norm
    with pytest.raises(UnsupportedModel, match="use_sliding_window"):
        LlamaArch.from_hf_config({**QWEN3_06B, "use_sliding_window": True})


def test_validate_local_reads_the_model_folders_config(kuberl_cli: str, tmp_path) -> None:
    import json
    import subprocess

    import yaml

    repo = __import__("pathlib").Path(__file__).resolve().parent.parent
    doc = yaml.safe_load((repo / "examples" / "grpo-smollm2-arith.yaml").read_text())
    model = tmp_path / "model"
    model.mkdir()
    doc["spec"]["model"] = {"path": "model"}  # beside the manifest
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))

    def validate() -> subprocess.CompletedProcess:
        return subprocess.run([kuberl_cli, "validate", "--local", str(job)], capture_output=True, text=True, timeout=120)

    assert validate().returncode == 0  # no config.json here: the run will say so, validate does not guess
    (model / "config.json").write_text(json.dumps({**QWEN3_06B, "model_type": "gemma2"}))
    refused = validate()
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "spec.model.path" in refused.stderr and "'gemma2' is not a supported model family" in refused.stderr
    (model / "config.json").write_text(json.dumps({**QWEN3_06B, "num_key_value_heads": 1}))
    # Two ranks at tp=2, which one key/value head cannot split.
    doc["spec"]["roles"]["actor"].update(replicas=1, gpusPerReplica=2, layout={"tp": 2, "pp": 1, "dp": 1, "rolloutTp": 1})
    job.write_text(yaml.safe_dump(doc))
    split = validate()
    assert split.returncode == 1 and "roles.actor.layout: tp=2 must divide the 1 key/value heads" in split.stderr, split.stderr
    (model / "config.json").write_text("[1, 2]")
    assert "cannot be read as a model's config" in validate().stderr
    (model / "config.json").write_text(" " * (2 << 20) + "{}")  # a hostile size is refused before it is parsed
    assert "larger than 1048576 bytes: not a model's config.json" in validate().stderr


def test_kuberl_run_refuses_a_model_it_cannot_train_before_any_rank_starts(kuberl_cli: str, tmp_path) -> None:
    import json
    import subprocess

    import yaml

    repo = __import__("pathlib").Path(__file__).resolve().parent.parent
    doc = yaml.safe_load((repo / "examples" / "grpo-smollm2-arith.yaml").read_text())
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({**QWEN3_06B, "model_type": "gemma2"}))
    doc["spec"]["model"] = {"path": "model"}  # from the folder `kuberl run` runs in, as its ranks read it
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    run = subprocess.run([kuberl_cli, "run", "job.yaml", "--out", "out"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "spec.model.path" in run.stderr and "'gemma2' is not a supported model family" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()  # no rank started, no run folder made


def test_a_job_names_a_mixture_of_experts_model_with_its_expert_layout() -> None:
    from kuberl.engine.config.lora import LoRASpec
    from kuberl.engine.config.topology import EngineConfig
    from kuberl.engine.models.support import check_model

    def config(layout: dict, ranks: int = 1) -> EngineConfig:
        return EngineConfig.model_validate(
            {
                "job": "j",
                "worldSize": ranks,
                "masterPort": 29500,
                "model": {"path": "/m"},
                "data": {"train": {"path": "d.jsonl"}},
                "algorithm": {"name": "grpo"},
                "reward": {"rules": [{"name": "math_answer"}]},
                "trainer": {"totalSteps": 1},
                "roles": {"actor": {"ranks": ranks, "rankOffset": 0, "procsPerPod": 1, "layout": layout}},
            }
        )

    moe = {
        **QWEN3_06B,
        "model_type": "qwen3_moe",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    }
    assert check_model(moe, config({"dp": 1})).num_experts == 8
    assert check_model(moe, config({"dp": 4, "ep": 4}, 4)).num_experts == 8
    with pytest.raises(UnsupportedModel, match="roles.actor.layout: ep=16 must divide the 8 experts"):
        check_model(moe, config({"dp": 16, "ep": 16}, 16))
    with pytest.raises(UnsupportedModel, match="roles.actor.layout: tp=2 is not supported for mixture-of-experts"):
        check_model(moe, config({"tp": 2}, 2))
    lora = config({"dp": 1}).model_copy(update={"trainer": config({"dp": 1}).trainer.model_copy(update={"lora": LoRASpec(rank=8)})})
    with pytest.raises(UnsupportedModel, match="trainer.lora: LoRA on a mixture-of-experts model is not supported yet"):
        check_model(moe, lora)
    assert check_model(QWEN3_06B, config({"dp": 1})).qk_norm  # a dense Qwen3 passes
    with pytest.raises(UnsupportedModel, match="ep=2: expert parallelism needs a mixture-of-experts model"):
        check_model(QWEN3_06B, config({"dp": 2, "ep": 2}, 2))

"""Mixture of experts (Qwen3-MoE, Mixtral) on megatron-core's MoE layer, CPU/gloo: parity with transformers at one
rank and under expert parallelism (ep=2 over 2 processes), the weight conversion both ways, and the refusals.

The multi-rank runs use tests/engine/workers/megatron_forward.py (--ep), one process per rank, as
tests/engine/test_megatron.py does for dense models.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from kuberl.engine.models.arch import LlamaArch, UnsupportedModel
from kuberl.engine.models.convert import hf_to_megatron, megatron_to_hf, unfuse_hf_experts
from kuberl.operator.cli.ports import free_port

from .rank_processes import wait_for_ranks

WORKER = Path(__file__).parent / "workers" / "megatron_forward.py"
COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    num_experts_per_tok=2,
)


def moe_config(kind: str, **overrides) -> transformers.PretrainedConfig:
    # No load-balancing loss in these models: transformers adds none to its loss (output_router_logits off), megatron
    # adds its own only to the gradients; with the coefficient 0 both compute the same loss and gradients.
    if kind == "qwen3_moe":  # norm_topk_prob False (its default): megatron's pre-softmax routing
        return transformers.Qwen3MoeConfig(
            **{
                **COMMON,
                "intermediate_size": 128,
                "moe_intermediate_size": 32,
                "num_experts": 4,
                "head_dim": 32,
                "router_aux_loss_coef": 0.0,
                "tie_word_embeddings": False,
                **overrides,
            }
        )
    # mixtral: softmax over the top k
    return transformers.MixtralConfig(
        **{
            **COMMON,
            "intermediate_size": 32,
            "num_local_experts": 4,
            "router_aux_loss_coef": 0.0,
            "tie_word_embeddings": False,
            **overrides,
        }
    )


def make_model(kind: str, directory: Path) -> tuple[Path, dict]:
    """A small random MoE model, its batch, and transformers' logits, loss and gradients (checkpoint names)."""
    torch.manual_seed(0)
    config = moe_config(kind)
    model = (transformers.Qwen3MoeForCausalLM if kind == "qwen3_moe" else transformers.MixtralForCausalLM)(config).float()
    with torch.no_grad():  # norms start at ones: give each its own values, so a mix-up shows
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight"):
                weight.copy_(1 + 0.5 * torch.randn_like(weight))
    arch = LlamaArch.from_hf_config(config.to_dict())
    ids = torch.randint(0, 256, (2, 16))
    path = directory / f"{kind}.pt"
    torch.save(
        {
            "hf_config": config.to_dict(),
            "input_ids": ids,
            "state_dict": unfuse_hf_experts({k: v.clone() for k, v in model.state_dict().items()}, arch),
        },
        path,
    )
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), torch.roll(ids, -1, dims=1).reshape(-1))
    loss.backward()
    grads = unfuse_hf_experts({n: p.grad.detach() for n, p in model.named_parameters()}, arch)
    renormalised = None
    if kind == "qwen3_moe":  # the same weights routed Mixtral's way (norm_topk_prob on)
        routers = [m for m in model.modules() if hasattr(m, "norm_topk_prob")]
        assert routers
        for router in routers:
            router.norm_topk_prob = True
        with torch.no_grad():
            renormalised = model(ids).logits
    return path, {"logits": logits.detach(), "loss": loss.detach(), "grads": grads, "renormalised_logits": renormalised}


def run_layout(model: Path, out: Path, ep: int) -> dict:
    """Megatron over `ep` gloo processes (tp=pp=1, dp=ep: attention data parallel, experts split), in megatron's DDP."""
    port = free_port()
    logs = [out.with_suffix(f".rank{r}.log") for r in range(ep)]
    extra = ["--dp-wrap"] if ep > 1 else []
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--rank",
                str(r),
                "--world",
                str(ep),
                "--port",
                str(port),
                "--ep",
                str(ep),
                *extra,
                "--model",
                str(model),
                "--out",
                str(out),
            ],
            stdout=open(logs[r], "w"),
            stderr=subprocess.STDOUT,
        )
        for r in range(ep)
    ]
    wait_for_ranks(procs, logs)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    directory = tmp_path_factory.mktemp("moe")
    return {kind: make_model(kind, directory) for kind in ("qwen3_moe", "mixtral")}


def _batch_first(logits: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return logits if logits.shape == like.shape else logits.transpose(0, 1)


# (logits, loss, gradients) absolute tolerances. fp32 throughout, the same operations in other orders (fused QKV,
# megatron's token permutation, per-expert matmuls and its sums of the top k), so results differ in the last bits:
# measured here 3.3e-7 on logits of size ~0.8, 4.8e-7 on the loss, 1.2e-7 on gradients, at ep=1 and ep=2 alike.
# The tolerances leave ~10-30x room for other BLAS orders; a token routed the other family's way moves logits by
# 2e-2 (test_routing_is_what_the_equality_tests), a swapped expert's weights by as much.
TOLERANCE = (1e-5, 1e-5, 1e-6)


def _assert_matches(out: dict, reference: dict, tolerance: tuple[float, float, float]) -> None:
    logits_tol, loss_tol, grad_tol = tolerance
    assert (_batch_first(out["logits"], reference["logits"]) - reference["logits"]).abs().max() < logits_tol
    assert abs(out["loss"].item() - reference["loss"].item()) < loss_tol
    assert set(out["hf_grads"]) == set(reference["grads"])
    for name, grad in reference["grads"].items():
        assert torch.allclose(out["hf_grads"][name], grad, atol=grad_tol, rtol=0), name


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_one_process_matches_transformers(models, tmp_path: Path, kind: str) -> None:
    path, reference = models[kind]
    _assert_matches(run_layout(path, tmp_path / "out.pt", 1), reference, TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_expert_parallel_matches_transformers(models, tmp_path: Path, kind: str) -> None:
    """ep=2 over 2 processes: each rank holds half the experts and one sequence of the batch."""
    path, reference = models[kind]
    _assert_matches(run_layout(path, tmp_path / "out.pt", 2), reference, TOLERANCE)


def test_routing_is_what_the_equality_tests(models) -> None:
    """The two routing rules (top k of the softmax renormalised or not) give logits far apart on these models, so the
    equality above checks the routing rule, not just the expert weights."""
    _, reference = models["qwen3_moe"]
    assert (reference["renormalised_logits"] - reference["logits"]).abs().max() > 50 * TOLERANCE[0]


# --- conversion, without processes ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize(("pp", "ep"), [(1, 1), (1, 2), (2, 2), (1, 4)])
def test_conversion_round_trip_is_exact(models, kind: str, pp: int, ep: int) -> None:
    blob = torch.load(models[kind][0], weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    shards = {(p, 0, e): hf_to_megatron(blob["state_dict"], arch, 0, 1, p, pp, e, ep) for p in range(pp) for e in range(ep)}
    back = megatron_to_hf(shards, arch)
    assert set(back) == set(blob["state_dict"])
    assert all(torch.equal(back[k], v) for k, v in blob["state_dict"].items())


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_exported_folder_loads_in_transformers(models, tmp_path: Path, kind: str) -> None:
    """megatron_to_hf's names are the checkpoints': transformers loads the exported folder and computes the same logits."""
    import json

    import safetensors.torch

    path, reference = models[kind]
    blob = torch.load(path, weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    back = megatron_to_hf({(0, 0, e): hf_to_megatron(blob["state_dict"], arch, ep_rank=e, ep_size=2) for e in range(2)}, arch)
    safetensors.torch.save_file({k: v.contiguous() for k, v in back.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(blob["hf_config"]))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(model(blob["input_ids"]).logits, reference["logits"])


def test_expert_e_lives_on_ep_rank_e_over_experts_per_rank(models) -> None:
    blob = torch.load(models["mixtral"][0], weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    assert arch.hf_moe_prefix == "block_sparse_moe" and arch.num_experts == 4
    rank1 = hf_to_megatron(blob["state_dict"], arch, ep_rank=1, ep_size=2)
    experts = sorted(k for k in rank1 if "local_experts" in k and k.startswith("decoder.layers.0."))
    assert experts == [f"decoder.layers.0.mlp.experts.local_experts.{j}.linear_fc{i}.weight" for j in (0, 1) for i in (1, 2)]
    w1, w3, w2 = (blob["state_dict"][f"model.layers.0.block_sparse_moe.experts.3.{w}.weight"] for w in ("w1", "w3", "w2"))
    assert torch.equal(rank1["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"], torch.cat([w1, w3]))
    assert torch.equal(rank1["decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"], w2)
    assert torch.equal(rank1["decoder.layers.0.mlp.router.weight"], blob["state_dict"]["model.layers.0.block_sparse_moe.gate.weight"])


# --- the config and its refusals -------------------------------------------------------------------


def test_config_maps_to_megatron_router() -> None:
    from kuberl.engine.training.megatron_model import moe_config as megatron_moe

    qwen = LlamaArch.from_hf_config(moe_config("qwen3_moe", router_aux_loss_coef=0.001).to_dict())
    assert (qwen.num_experts, qwen.experts_per_token, qwen.moe_intermediate_size, qwen.qk_norm) == (4, 2, 32, True)
    fields = megatron_moe(qwen, ep=2)
    assert fields["num_moe_experts"] == 4 and fields["moe_router_topk"] == 2 and fields["moe_ffn_hidden_size"] == 32
    assert fields["moe_router_pre_softmax"] is True and fields["moe_aux_loss_coeff"] == 0.001
    assert fields["moe_token_dispatcher_type"] == "alltoall" and fields["expert_model_parallel_size"] == 2
    assert megatron_moe(qwen)["moe_token_dispatcher_type"] == "allgather"
    normed = LlamaArch.from_hf_config(moe_config("qwen3_moe", norm_topk_prob=True).to_dict())
    assert megatron_moe(normed)["moe_router_pre_softmax"] is False
    mixtral = LlamaArch.from_hf_config(moe_config("mixtral").to_dict())
    assert megatron_moe(mixtral)["moe_router_pre_softmax"] is False and mixtral.moe_intermediate_size == 32
    assert not mixtral.qk_norm
    # Qwen3-MoE's own config.json names the experts num_experts (transformers 5 writes num_local_experts).
    raw = {**moe_config("qwen3_moe").to_dict(), "num_experts": 8}
    raw.pop("num_local_experts", None)
    assert LlamaArch.from_hf_config(raw).num_experts == 8


@pytest.mark.parametrize(
    ("kind", "overrides", "field"),
    [
        ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
        ("qwen3_moe", {"mlp_only_layers": [0]}, "mlp_only_layers"),
        ("qwen3_moe", {"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size"),
        ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
        ("mixtral", {"sliding_window": 16}, "sliding_window"),
    ],
)
def test_what_megatron_cannot_match_is_refused_by_name(kind: str, overrides: dict, field: str) -> None:
    raw = {**moe_config(kind).to_dict(), **overrides}
    with pytest.raises(UnsupportedModel, match=field):
        LlamaArch.from_hf_config(raw)


def test_layouts_megatron_cannot_run_are_refused() -> None:
    arch = LlamaArch.from_hf_config(moe_config("qwen3_moe").to_dict())
    arch.check_layout(1, 2, 4)
    with pytest.raises(UnsupportedModel, match="ep=3 must divide the 4 experts"):
        arch.check_layout(1, 1, 3)
    with pytest.raises(UnsupportedModel, match="tp=2 is not supported for mixture-of-experts.*sequence parallelism"):
        arch.check_layout(2, 1, 1)
    dense = LlamaArch.from_hf_config(
        transformers.Qwen3Config(**{k: v for k, v in COMMON.items() if k != "num_experts_per_tok"}, intermediate_size=128).to_dict()
    )
    with pytest.raises(UnsupportedModel, match="ep=2: expert parallelism needs a mixture-of-experts model"):
        dense.check_layout(1, 1, 2)


def test_a_job_takes_moe_with_ep_and_refuses_the_layouts_it_cannot_train() -> None:
    """What the initializer and `kuberl validate --local` run on a model's config.json: a job runs an MoE model,
    with its experts split over `ep` of its data-parallel ranks; tp > 1, an ep that does not divide the experts or
    dp, and ep on a dense model are refused before any pod starts."""
    import yaml
    from pydantic import ValidationError

    from kuberl.engine.models.support import check_model
    from kuberl.operator.api import RLJob
    from kuberl.operator.control.planner import engine_config

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "grpo-smollm2-arith.yaml").read_text())
    raw = moe_config("mixtral").to_dict()

    def with_layout(**layout) -> dict:
        actor = {**doc["spec"]["roles"]["actor"], "gpusPerReplica": layout["dp"], "layout": {"rolloutTp": 1, **layout}}
        return {**doc, "spec": {**doc["spec"], "roles": {**doc["spec"]["roles"], "actor": actor}}}

    assert check_model(raw, engine_config(RLJob.model_validate(doc))).num_experts == 4
    config = engine_config(RLJob.model_validate(with_layout(tp=1, pp=1, dp=2, ep=2)))
    assert config.roles["actor"].layout.ep == 2
    assert check_model(raw, config).num_experts == 4
    with pytest.raises(UnsupportedModel, match="ep=8 must divide the 4 experts"):
        check_model(raw, engine_config(RLJob.model_validate(with_layout(tp=1, pp=1, dp=8, ep=8))))
    with pytest.raises(ValidationError, match="ep must divide dp"):
        RLJob.model_validate(with_layout(tp=1, pp=1, dp=2, ep=4))
    with pytest.raises(UnsupportedModel, match="ep=2: expert parallelism needs a mixture-of-experts model"):
        check_model(family_example("llama"), config)
    arch = LlamaArch.from_hf_config(raw)
    with pytest.raises(UnsupportedModel, match="tp=2 is not supported for mixture-of-experts"):
        arch.check_layout(2, 1)


def family_example(name: str) -> dict:
    from kuberl.engine.models.families import FAMILIES

    return dict(FAMILIES[name].example)


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize(("pp", "ep"), [(1, 1), (1, 2), (2, 2), (1, 4), (2, 1)])
def test_the_switch_moves_the_expert_bytes_the_formula_says(kind: str, pp: int, ep: int) -> None:
    """The plan of the switch into vLLM (t_g = 1): every rank gets every expert; on average over the ranks it
    receives HybridFlow's bytes for the experts split over pp*ep ranks plus the rest's over pp (tp is 1), and
    with one stage each rank exactly (ep - 1)/ep of the experts' bytes."""
    from kuberl.engine.hybrid.plan import is_expert, moe_switch_bytes, received_bytes, transfer_units

    arch = LlamaArch.from_hf_config(moe_config(kind).to_dict())
    units = transfer_units(arch, 1, pp, ep)
    experts = sum(p.numel() * 4 for u in units if is_expert(u) for p in u.pieces)
    rest = sum(p.numel() * 4 for u in units if not is_expert(u) for p in u.pieces)
    per_expert = 3 * arch.moe_intermediate_size * arch.hidden_size * 4
    assert experts == arch.num_layers * arch.num_experts * per_expert
    got = [received_bytes(units, s, 0, 4, ep_rank=e) for s in range(pp) for e in range(ep)]
    assert sum(got) / len(got) == pytest.approx(moe_switch_bytes(rest, experts, 1, pp, ep), rel=1e-12)
    if pp == 1:
        assert got == [(ep - 1) * experts // ep] * ep


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_the_switch_gives_vllm_the_checkpoint_s_expert_names(kind: str, models) -> None:
    """One rank (ep=1): the switch streams exactly the checkpoint's tensors under its names, routers and experts
    included (what vLLM's Qwen3-MoE and Mixtral load_weights map onto their fused experts)."""
    from kuberl.engine.hybrid.reshard import Resharder

    blob = torch.load(models[kind][0], weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    out = dict(Resharder(arch, 1, 1, 0, 0, {(0, 0): 0}, None).stream(hf_to_megatron(blob["state_dict"], arch)))
    assert set(out) == set(blob["state_dict"])
    assert all(torch.equal(out[k], blob["state_dict"][k]) for k in out)

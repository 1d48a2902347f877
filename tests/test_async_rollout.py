"""Asynchronous RL's pure decisions (which batches may be asked for, which may be trained on, the
staleness each reports) and the weight stream to rollout ranks of their own over gloo."""

from __future__ import annotations

import pytest

from kuberl.engine.rollout.staleness import may_consume, staleness, staleness_metrics, steps_to_issue


@pytest.mark.parametrize(
    "step, issued, bound, total, expected",
    [
        (0, -1, 0, 5, [0]),  # synchronous: each batch at its own step
        (3, 2, 0, 5, [3]),
        (0, -1, 1, 5, [0, 1]),  # one ahead: the next batch is asked for before this step's update
        (1, 1, 1, 5, [2]),
        (0, -1, 2, 5, [0, 1, 2]),
        (3, 4, 2, 5, []),  # never past the last step
        (4, 4, 1, 5, []),
        (2, -1, 1, 5, [2, 3]),  # a resumed run asks again from its own step
    ],
)
def test_steps_to_issue_stay_within_the_bound(step: int, issued: int, bound: int, total: int, expected: list[int]) -> None:
    assert list(steps_to_issue(step, issued, bound, total)) == expected


def test_a_pipeline_of_issues_never_breaks_the_bound() -> None:
    """Walk whole runs: every batch, asked for at the version of its step of issue, is trained within the bound."""
    for bound in range(4):
        for total in range(1, 9):
            issued_through, issued_at = -1, {}
            for step in range(total):
                for k in steps_to_issue(step, issued_through, bound, total):
                    issued_at[k] = step
                    issued_through = k
                assert step in issued_at and may_consume(step, issued_at[step], bound)
                assert staleness(step, issued_at[step]) == min(bound, step)  # steady state: exactly the bound
            assert sorted(issued_at) == list(range(total))


def test_may_consume_and_staleness() -> None:
    assert may_consume(5, 5, 0) and not may_consume(5, 4, 0)
    assert may_consume(5, 3, 2) and not may_consume(5, 2, 2)
    with pytest.raises(ValueError, match="cannot be ahead"):
        staleness(1, 2)


def test_staleness_metrics_count_tokens_by_distance() -> None:
    out = staleness_metrics(4, [(3, 3, 3), (4, 4), (2,)])
    assert out["staleness"] == 2.0
    assert out["staleness_mean"] == pytest.approx((3 * 1 + 2 * 0 + 1 * 2) / 6)
    assert {k: v for k, v in out.items() if k.startswith("staleness_tokens/")} == {
        "staleness_tokens/0": 2.0,
        "staleness_tokens/1": 3.0,
        "staleness_tokens/2": 1.0,
    }
    assert staleness_metrics(4, [()]) == {}


def _stream_rank(rank: int, size: int, port: int, out: dict) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from kuberl.engine.distributed.role_worlds import ObjectLink
    from kuberl.engine.distributed.weight_stream import BucketHeader, WeightBucket, receive_buckets, send_buckets

    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, wait_for_workers=False, timeout=timedelta(seconds=60))
    link = ObjectLink(store, "rollout", rank, size, timedelta(seconds=60))
    torch.manual_seed(0)
    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5), "c": torch.randn(2, 2, 2)}
    buckets = [
        WeightBucket(BucketHeader(("a", "b"), ((3, 4), (5,)), "float32"), torch.cat([tensors["a"].reshape(-1), tensors["b"]])),
        WeightBucket(BucketHeader(("c",), ((2, 2, 2),), "float32"), tensors["c"].reshape(-1)),
    ]
    if rank == 0:
        out["sent"] = send_buckets(link, buckets)
        out["header_bytes"] = sum(b.header.nbytes for b in buckets)
    else:
        got = dict(receive_buckets(link))
        out[f"equal-{rank}"] = list(got) == ["a", "b", "c"] and all(torch.equal(got[k], tensors[k]) for k in tensors)


def _run(rank, size, port, queue):
    out: dict = {}
    _stream_rank(rank, size, port, out)
    queue.put((rank, out))


def test_weights_reach_every_rollout_rank_bucket_by_bucket() -> None:
    import multiprocessing as mp

    from kuberl.operator.cli.ports import free_port

    ctx = mp.get_context("fork")  # the children run this module's functions
    queue = ctx.Queue()
    port, size = free_port(), 3
    procs = [ctx.Process(target=_run, args=(r, size, port, queue)) for r in range(size)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results[0]["sent"] == results[0]["header_bytes"] == (12 + 5 + 8) * 4
    assert results[1]["equal-1"] and results[2]["equal-2"]


def _engine_config(algorithm: dict, rollout: dict, roles: dict):
    from kuberl.engine.config.topology import EngineConfig

    world = sum(r["ranks"] for r in roles.values())
    return EngineConfig.model_validate(
        {
            "job": "j",
            "worldSize": world,
            "masterPort": 29500,
            "model": {"path": "m"},
            "data": {"train": {"path": "d.jsonl"}},
            "algorithm": algorithm,
            "rollout": {"samplesPerPrompt": 2, **rollout},
            "reward": {"rules": [{"name": "math_answer"}]},
            "trainer": {"totalSteps": 1},
            "roles": roles,
        }
    )


ACTOR = {"ranks": 1, "rankOffset": 0, "procsPerPod": 1, "layout": {"dp": 1}}
FLEET = {"ranks": 2, "rankOffset": 1, "procsPerPod": 1, "layout": {"dp": 2}}


@pytest.mark.parametrize(
    "algorithm, rollout, roles, message",
    [
        ({"name": "grpo", "async": {"maxStaleness": 1}}, {}, {"actor": ACTOR}, "algorithm.async: generation ahead of the update needs"),
        (
            {"name": "grpo"},
            {},
            {"actor": ACTOR, "rollout": FLEET},
            "roles.rollout: the role generates only with rollout.placement: separate",
        ),
        ({"name": "grpo"}, {"placement": "separate"}, {"actor": ACTOR}, "roles.rollout: rollout.placement: separate needs"),
        (
            {"name": "dapo"},
            {"placement": "separate"},
            {"actor": ACTOR, "rollout": FLEET},
            "runs the on_policy step only, for now, not dynamic_sampling",
        ),
        (
            {"name": "reinforce_pp", "advantage": {"name": "remax"}},
            {"placement": "separate"},
            {"actor": ACTOR, "rollout": FLEET},
            "does not run remax yet",
        ),
        (
            {"name": "grpo"},
            {"placement": "separate", "backend": "hf"},
            {"actor": ACTOR, "rollout": FLEET},
            "rollout.backend: not supported",
        ),
        (
            {"name": "grpo"},
            {"placement": "separate"},
            {"actor": ACTOR, "rollout": {**FLEET, "layout": {"tp": 2, "dp": 1}}},
            "one vLLM engine per rank",
        ),
    ],
)
def test_the_engine_refuses_what_separate_placement_does_not_run(algorithm, rollout, roles, message) -> None:
    from kuberl.engine.runtime.checks import ConfigError, check_placement

    with pytest.raises(ConfigError, match=message):
        check_placement(_engine_config(algorithm, rollout, roles))


def test_the_engine_accepts_async_on_separate_placement() -> None:
    from kuberl.engine.runtime.checks import check_placement

    check_placement(
        _engine_config({"name": "grpo", "async": {"maxStaleness": 2}}, {"placement": "separate"}, {"actor": ACTOR, "rollout": FLEET})
    )


class _FakeFleet:
    def __init__(self):
        self.synced: list[int] = []
        self.asked: list[tuple[int, int]] = []  # (version, seed)

    def sync(self, version: int) -> None:
        if not self.synced or self.synced[-1] != version:
            self.synced.append(version)

    def submit(self, prompts, sampling, seed):
        from kuberl.engine.distributed.rollout_fleet import Ticket

        self.asked.append((self.synced[-1], seed))
        return Ticket(self.synced[-1], None)


def _ctx(step: int, loader):
    from contextlib import nullcontext
    from types import SimpleNamespace

    run = SimpleNamespace(loader=loader, encoder=SimpleNamespace(encode=lambda e: [len(e.prompt)]))
    return SimpleNamespace(
        step=step, run=run, timer=lambda name: nullcontext(), sampling=lambda: None, config=SimpleNamespace(trainer=SimpleNamespace(seed=3))
    )


def test_the_pipeline_asks_ahead_with_the_current_version_and_a_checkpoint_keeps_prompts_on_their_way() -> None:
    from kuberl.engine.data.prompts import Example, PromptLoader
    from kuberl.engine.steps.async_rollout import GenerationPipeline, sampling_seed

    examples = [Example(f"q{i}", str(i)) for i in range(40)]
    loader = PromptLoader(examples, 4, seed=1)
    fleet = _FakeFleet()
    pipeline = GenerationPipeline(fleet, max_staleness=2, total_steps=6)
    trained = []
    for step in range(3):
        batch = pipeline.examples(_ctx(step, loader))
        assert pipeline.take(step, batch) is not None
        trained.append([e.prompt for e in batch])
    # Steps 0-2 asked at version 0, step 3 at 1, step 4 at 2; each with its own step's seed.
    assert fleet.asked == [(0, sampling_seed(3, k, 0, 0)) for k in range(3)] + [
        (1, sampling_seed(3, 3, 0, 0)),
        (2, sampling_seed(3, 4, 0, 0)),
    ]
    on_their_way = [[e.prompt for e in pipeline.issued[k].examples] for k in (3, 4)]
    # A checkpoint after step 3 (the trainer is about to train step 3): the loader as it stood before batch 3.
    resumed = PromptLoader(examples, 4, seed=1)
    resumed.load_state_dict(pipeline.loader_state(3, loader.state_dict()))
    assert [[e.prompt for e in resumed.next_batch()] for _ in range(2)] == on_their_way
    # Nothing on its way: the loader's own state.
    assert GenerationPipeline(fleet, 0, 6).loader_state(0, {"epoch": 0, "position": 8}) == {"epoch": 0, "position": 8}
    uninterrupted = PromptLoader(examples, 4, seed=1)
    assert [[e.prompt for e in uninterrupted.next_batch()] for _ in range(5)] == trained + on_their_way

"""One rank of a multi-turn job that runs one real step of each algorithm given (`RLRun.use_algorithm`,
as workers/algorithm_steps.py does) and records what a metric cannot show: the advantage estimators
the step called, and each trajectory of the batch it trained on, split by the loss mask of its packed
row (the tokens the loss reads and those it does not) next to its conversation. Started like
`kuberl run` starts its ranks; rank 0 writes one JSON record per step to --out."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path


def runs(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal mask: (mask, ids)."""
    out: list[tuple[int, list[int]]] = []
    for token, m in zip(ids, mask):
        if out and out[-1][0] == m:
            out[-1][1].append(token)
        else:
            out.append((m, [token]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algorithms", required=True, help="a JSON list of algorithm specs (manifest names)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    logging.basicConfig(level=logging.WARNING)
    import torch

    import kuberl.engine.algorithms as A
    from kuberl.engine.config.algorithm import AlgorithmSpec
    from kuberl.engine.config.topology import EngineConfig
    from kuberl.engine.distributed.role_worlds import join
    from kuberl.engine.distributed.world import RankEnv, init_model_parallel
    from kuberl.engine.runtime.rl import RLRun, Timer
    from kuberl.engine.steps.training_ops import TrainingOps

    torch.set_num_threads(int(os.environ.get("KUBERL_THREADS", "1")))
    env = RankEnv.from_environ()
    config = EngineConfig.model_validate_json(Path(os.environ["KUBERL_CONFIG"]).read_text())
    specs = [AlgorithmSpec.model_validate(raw, by_name=False, by_alias=True) for raw in json.loads(args.algorithms)]
    world = join(env, config)
    init_model_parallel(world.block.tp, world.block.pp, config.trainer.seed)
    run = RLRun(config, world, Path(os.environ["KUBERL_RUN_DIR"]))
    tokenizer = run.tokenizer

    called: list[str] = []
    lookup = A.advantage_estimator

    def advantage_estimator(name: str):
        called.append(name)
        return lookup(name)

    A.advantage_estimator = advantage_estimator  # training_ops calls it as A.advantage_estimator
    trained: list[dict] = []
    pack_batch = TrainingOps.batch

    def batch(self, rollout):
        out = pack_batch(self, rollout)
        rows = out.rows
        for b, completion in enumerate(rollout.completions):
            start, length = int(rows.prompt_lens[b]), int(rows.response_lens[b])
            ids = rows.input_ids[b, start:start + length].tolist()
            mask = [int(m) for m in rows.mask[b, :length].tolist()]
            trained.append({
                "messages": completion.messages, "tool_calls": completion.tool_calls,
                "trained": [tokenizer.decode(t, skip_special_tokens=False) for m, t in runs(ids, mask) if m],
                "not_trained": [tokenizer.decode(t, skip_special_tokens=False) for m, t in runs(ids, mask) if not m],
                "own_mask_is_the_rows": list(completion.token_ids.mask) == mask})
        return out

    TrainingOps.batch = batch
    out = []
    for spec in specs:
        run.use_algorithm(spec)
        called.clear()
        trained.clear()
        before = {k: v.clone() for k, v in run.actor.megatron_state().items()}
        record = run.run_step(Timer())
        run.step += 1
        moved = any(not torch.equal(before[k], v) for k, v in run.actor.megatron_state().items())
        out.append({"algorithm": spec.to_manifest(), "moved": moved, "estimators": list(called),
                    "trajectories": list(trained), **record})
    if env.rank == 0:
        Path(args.out).write_text("\n".join(json.dumps(r) for r in out))
    run.close()


if __name__ == "__main__":
    main()

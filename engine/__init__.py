"""The RL engine: what every rank of a job runs (`kuberl worker`), and `kuberl run` on one machine.

Its folders are layers, listed below from the bottom up: a module imports from its own folder and from
the folders before it, never after (tests/test_layers.py reads every import). The engine layers page of
the docs is generated from this list and the folders' own docstrings.
"""

LAYERS: tuple[tuple[str, str], ...] = (
    (
        "config",
        "the job's sections as pure pydantic models (no torch), and the contracts with the operator: "
        "EngineConfig (what every rank reads), ProgressReport, InitializationReport",
    ),
    ("compat", "megatron-core's CUDA-only calls redirected on a machine without CUDA (nothing changes where CUDA is)"),
    (
        "common",
        "what every layer above may need: dtypes, loading a user's code, timers, overlapping work with waiting, "
        "the hub cache's folders, the termination log",
    ),
    ("models", "the model families (one file each), their shape read from a Hugging Face config, weights on disk"),
    (
        "algorithms",
        "the RL math as pure tensor functions behind registries: advantage estimators, policy losses, KL estimators, aggregations, presets",
    ),
    ("data", "prompt sets: files or generators, chat templates, the seeded order a job walks them in"),
    ("tracking", "experiment trackers (TensorBoard, MLflow, W&B) behind a registry"),
    ("hub", "the initializer: hub repositories into a job's cache volume, verified, before its trainers start"),
    ("rewards", "rule functions by name, a user's Python function and reward models, summed with weights"),
    (
        "agents",
        "what multi-turn rollouts need besides generation: tools in their sandboxes, tool-call parsers, "
        "environments, chat rendering (no torch)",
    ),
    ("training", "megatron-core models per (TP, PP, EP) rank, packed micro-batches, losses, the update"),
    ("hybrid", "the weights' layouts for training and for generation, and the plan that moves them between the two"),
    (
        "rollout",
        "vLLM in process: generation with log-probabilities, the hybrid switch, multi-turn rollouts, staleness of separate rollouts",
    ),
    ("distributed", "worlds of ranks, the links between roles, the rollout fleet and the weights streamed to it"),
    ("steps", "one training step of a job, written against a StepContext of collective operations, behind a registry"),
    ("runtime", "one rank's life: composing the run, the RL loop, checkpoints, progress, metrics, stopping, `kuberl worker`"),
)
"""(folder, what it holds) of every layer, bottom to top."""

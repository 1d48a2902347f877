"""A new preset for kuberl, with no change to kuberl: RLOO's leave-one-out baseline with DRO's quadratic
penalty on the log-ratio in place of PPO's clip, at a beta of its own.

    algorithm:
      name: rloo_dro
      plugins: [{path: examples/plugins/rloo_dro.py}]
"""

from kuberl.engine.algorithms import register_preset

register_preset(
    "rloo_dro",
    summary="RLOO's baseline, DRO's quadratic penalty on the log-ratio instead of a clip",
    advantage="rloo",
    policy_loss="dro",
    policy_loss_options=lambda spec, block: {"beta": 0.05, "aggregation": spec.loss_aggregation},
)

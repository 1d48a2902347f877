"""What runs on each rank: world set-up, the policy on megatron-core, checkpoints, metrics and the RL loop."""

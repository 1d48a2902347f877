"""Training on megatron-core: models, parallel layouts, optimizers."""

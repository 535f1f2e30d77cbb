"""Training: datasets, the optimizer, the trainer, rewards, checkpoints, LoRA norms."""

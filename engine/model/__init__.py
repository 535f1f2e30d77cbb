"""Models: the architecture table, the block, the model-level forward, LoRA, targets, generation."""

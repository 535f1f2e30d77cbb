"""The Targets page: which tensors get LoRA adapters, as a grid and a tree."""

"""Tune Studio engine: UI-free GGUF loading, tokenization, forward/backward and training."""

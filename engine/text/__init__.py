"""Text: tokenizers and chat templates built from a GGUF file's metadata."""

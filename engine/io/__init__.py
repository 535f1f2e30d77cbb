"""Files: GGUF reading and writing, the weight store, quantizers, adapter and merged-model export."""

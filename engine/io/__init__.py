"""Files: GGUF reading and writing, the weight store (quantized at rest), dequantization and quantizers."""

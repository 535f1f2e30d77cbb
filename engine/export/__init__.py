"""Export: a trained adapter as an adapter GGUF that llama.cpp loads, or merged into its base model.

`write` writes the files (`export_adapter`, `export_merged`); `check` decides before writing what a
request would write and whether it can (`check_export`, `write_export`); `verify` reloads a written
file and compares its logits with the base model plus the adapter. Export sits above the model
(it reads adapters and loads models) and below training, which writes its adapters through it.
"""

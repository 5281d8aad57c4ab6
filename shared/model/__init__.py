"""The model kit: tiny test models (tinymodel), LoRA adapter files (adapters), the logits mask of
constrained decoding (logits_mask) and the GGUF import of `jetrl model import-gguf` (model_import)."""

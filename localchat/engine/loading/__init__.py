"""Loading a model: checkpoints (GGUF, safetensors), weight repacking, model info and cache."""

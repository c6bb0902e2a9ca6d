"""Where weights come from: the preset catalog and cache, GGUF conversion, checkpoints, stored quantized models."""

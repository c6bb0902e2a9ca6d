"""The decoder that runs without transformers' modeling code: the native causal LM, its C++ step, the lean and row-wise attention."""

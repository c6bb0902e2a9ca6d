"""Quantized weights and layers: int8 (per row, block-invariant), int4 (Q4_K), fusion of sibling projections, smoothing, the draft's cut head, block-form embeddings."""

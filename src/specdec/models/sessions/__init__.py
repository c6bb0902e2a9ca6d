"""Sessions over a model's cache: prefill / extend / rollback, batched rows, the CUDA-graph capture plan."""

"""A preset's weight file read into a model built without weights, the weights in the process's own memory.

transformers' ``from_pretrained`` memory-maps a safetensors file, and the model then computes from the
mapped file pages. Measured on the Qwen 1.5B in bf16 (AVX-512 EPYC, one process holding both models,
alternated six times, 16 decoding steps each), a step took a median 212.7 ms loaded by ``from_pretrained``
against 197.9 ms loaded by :func:`load_dense` (7% longer), with identical logits. Copying every tensor out of one
mapping holds the mapped pages and the copies together (peak 6.9 GiB for the 1.5B); :func:`read_tensors`
copies them in chunks of :data:`CHUNK_BYTES`, each chunk through its own mapping, closed before the next:
the peak is the model plus one chunk (3.7 GiB with 256 MiB chunks, which read the 3.3 GiB in about 1 s).
64 MiB chunks took a whole ``specdec generate`` run of the default pair from a peak of 5.71-5.83 GiB
to 5.64-5.70 GiB (three runs each).

:func:`load_dense` reads a dense variant (``model.safetensors``, ``model.fp32.safetensors``); the int8
variant (:func:`specdec.models.formats.stored.load_quantized`) shares :func:`empty_model` and :func:`fill`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from specdec.errors import SpecDecError

__all__ = ["CHUNK_BYTES", "empty_model", "fill", "load_dense", "read_tensors"]

#: Bytes copied through one mapping of the file before it is closed and the next one opened.
CHUNK_BYTES = 64 * 2**20


def read_tensors(path: str | Path, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the safetensors file ``path``, each a copy in process memory
    (converted to ``dtype`` if given: floating-point tensors only), read CHUNK_BYTES at a time."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
    i = 0
    while i < len(keys):
        with safe_open(str(path), framework="pt") as f:  # a fresh mapping per chunk
            copied = 0
            while i < len(keys) and copied < CHUNK_BYTES:
                mapped = f.get_tensor(keys[i])
                convert = dtype is not None and mapped.is_floating_point() and mapped.dtype != dtype
                tensor = mapped.to(dtype) if convert else mapped.clone()
                copied += mapped.numel() * mapped.element_size()
                del mapped
                yield keys[i], tensor
                i += 1


def empty_model(folder: str | Path, dtype: torch.dtype):
    """The causal LM of ``folder``'s config, its parameters on the meta device (no memory, no
    initialization); buffers computed as usual (rotary frequencies)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - older transformers
        from transformers.modeling_utils import no_init_weights

    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights(include_buffers=False), no_init_weights():
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def fill(hf, tensors: Iterator[tuple[str, torch.Tensor]] | dict, folder: str | Path, path: str | Path):
    """Put ``tensors`` into the empty model ``hf`` as its parameters and buffers (the tensors become
    the weights: no copy), tie the output embedding where the config says so, check that no weight is
    left empty, and read the generation config. Returns the model in eval mode."""
    from transformers import GenerationConfig

    for key, tensor in tensors.items() if isinstance(tensors, dict) else tensors:
        owner, _, attr = key.rpartition(".")
        module = hf.get_submodule(owner) if owner else hf
        if attr in module._parameters:
            module._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=tensor.is_floating_point())
        elif attr in module._buffers:
            module._buffers[attr] = tensor
        else:
            raise SpecDecError(f"{path}: unexpected tensor {key}")
    empty = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if empty and getattr(hf.config, "tie_word_embeddings", False):
        hf.tie_weights()
        empty = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if empty:
        raise SpecDecError(f"{path} lacks weights for: {', '.join(empty[:5])}")
    try:
        hf.generation_config = GenerationConfig.from_pretrained(folder)
    except OSError:
        pass
    return hf.eval()


def load_dense(folder: str | Path, path: str | Path, dtype: torch.dtype):
    """The model of ``folder`` with the weights of the dense file ``path`` (bf16 or float32), in ``dtype``."""
    return fill(empty_model(folder, dtype), read_tensors(path, dtype), folder, path)

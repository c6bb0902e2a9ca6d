"""A preset's exact architecture with random weights: step timings without the weight files.

A forward pass costs the same whatever the weights' values, so a GPU benchmark can time a preset's
architecture on a machine that holds no weights. The tokenizer is a byte-level stand-in (one token
per UTF-8 byte, ids 0-255), so prompts have about 3-4x the real tokenizer's length; the models have
no end-of-sequence token, so every generation runs to max_new_tokens. Alpha between two random
models says nothing about the real pair: every table that uses them says so.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.errors import SpecDecError

# The presets' architectures as transformers loads them from their GGUF files (untied output layer).
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-coder-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)),
    "qwen2.5-coder-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)),
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   max_position_embeddings=8192, rope_theta=1e5, rms_norm_eps=1e-5)),
}


def byte_tokenizer() -> Any:
    """A byte-level tokenizer: every UTF-8 byte is one token (ids 0-255), no merges, no special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def random_model(name: str, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """The preset ``name``'s architecture with random weights, as a LanguageModel on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec.models import load

    if name not in ARCHITECTURES:
        raise SpecDecError(f"--random-weights knows the architectures of {', '.join(ARCHITECTURES)}, not {name!r}")
    kind, fields = ARCHITECTURES[name]
    config = AutoConfig.for_model(kind, **fields, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf.generation_config.eos_token_id = None
    return load(hf, tokenizer=byte_tokenizer(), name=f"{name} (random weights)")

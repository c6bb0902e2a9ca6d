"""Decoder-only (causal) language models behind specdec's small model interface.

A :class:`LanguageModel` pairs a Hugging Face model with its tokenizer. A :class:`KVSession` holds
one sequence's KV cache. Rollback is position bookkeeping: the session remembers which tokens its
cache holds, and :meth:`KVSession.forward` crops the cache back to the longest common prefix with
the sequence it is asked about before feeding the rest. No prefix is ever recomputed, and no model
needs its own slicing code: the cache's ``crop`` does it for every architecture (Qwen2, Llama,
Gemma 3's sliding-window layers included). The cache is preallocated (:mod:`specdec.models.kv_cache`):
each forward pass writes its keys and values in place, and a crop only moves a length.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Sequence

import torch

from specdec.errors import SpecDecError
from specdec.models.kv_cache import preallocated_cache


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class KVSession:
    """The KV cache of one sequence being decoded by one model."""

    def __init__(self, model: "LanguageModel"):
        self.model = model
        self.cache = self._new_cache()
        self.tokens: list[int] = []  # the tokens whose keys and values are in the cache, in order
        self.forward_passes = 0
        self.last_pass_tokens = 0  # tokens the last forward pass computed (what its time depends on)

    def _new_cache(self):
        return preallocated_cache(self.model.hf_model.config)

    def _run(self, new: torch.Tensor, n_logits: int) -> torch.Tensor:
        """One forward pass over the new tokens [1, m] with the cache; returns logits [1, >= n_logits, V]."""
        return self.model.hf_model(
            input_ids=new, past_key_values=self.cache, use_cache=True, logits_to_keep=n_logits
        ).logits

    def forward(self, sequence: Sequence[int], n_logits: int) -> torch.Tensor:
        """Logits for the last ``n_logits`` positions of ``sequence``.

        sequence: the whole token sequence (prompt included) as ids.
        Returns [n_logits, V] float logits; row i predicts the token after sequence[: len - n_logits + i + 1].
        The cache is rolled back to the common prefix and then extended to hold all of ``sequence``.
        """
        keep = min(common_prefix_length(self.tokens, sequence), len(sequence) - n_logits)
        if keep < 0:
            raise ValueError(f"asked for {n_logits} logits of a {len(sequence)}-token sequence")
        # Crop only to remove tokens: crop(0) would also trim sliding-window layers (Gemma 3) to their
        # window and forget the past that a later rollback may need.
        if keep < len(self.tokens):
            self.cache.crop(-(len(self.tokens) - keep))
        del self.tokens[keep:]
        new = torch.tensor([list(sequence[keep:])], dtype=torch.long)  # [1, new]
        with torch.inference_mode():
            logits = self._run(new, n_logits)
        self.tokens.extend(sequence[keep:])
        self.forward_passes += 1
        self.last_pass_tokens = int(new.shape[1])
        return logits[0, -n_logits:]  # [n_logits, V]


class LanguageModel:
    """A causal language model and its tokenizer, as used by drafters and the decoding loop."""

    is_encoder_decoder = False

    def __init__(self, hf_model: Any, tokenizer: Any, name: str | None = None):
        if getattr(hf_model.config, "is_encoder_decoder", False):
            raise SpecDecError("this is an encoder-decoder model; load it with specdec.load(), which picks the seq2seq backend")
        self.hf_model = hf_model.eval()
        self.tokenizer = tokenizer
        self.quantization: str | None = None  # set by specdec.models.quantize
        self.name = name or getattr(hf_model.config, "_name_or_path", None) or type(hf_model).__name__

    def __repr__(self) -> str:
        return f"LanguageModel({self.name!r}, dtype={self.dtype}, params={self.num_parameters / 1e6:.0f}M)"

    # -- facts -----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length: padded embedding tables)."""
        head = self.hf_model.get_output_embeddings()
        if hasattr(head, "out_features"):  # nn.Linear, and dynamically quantized Linear
            return int(head.out_features)
        return int(head.weight.shape[0])

    @functools.cached_property
    def vocabulary_fingerprint(self) -> str:
        """A hash of the tokenizer's token -> id table, computed on first use and kept (tokenizers don't change)."""
        table = sorted(self.tokenizer.get_vocab().items())  # [(token, id)]
        return hashlib.sha256(repr(table).encode("utf-8")).hexdigest()

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf_model.parameters()).dtype

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.hf_model.parameters())

    @property
    def max_context(self) -> int | None:
        cfg = self.hf_model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return getattr(text_cfg, "max_position_embeddings", None)

    @property
    def eos_token_ids(self) -> set[int]:
        """End-of-sequence ids: the generation config's, else the model config's (as transformers' generate)."""
        for source in (getattr(self.hf_model, "generation_config", None), self.hf_model.config):
            value = getattr(source, "eos_token_id", None)
            if value is not None:
                return set([value] if isinstance(value, int) else value)
        return set()

    # -- text ------------------------------------------------------------------------------------
    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise SpecDecError(f"{self.name} has no chat template; drop chat=True (--chat) for this model")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):  # BatchEncoding in recent transformers
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # -- decoding --------------------------------------------------------------------------------
    def start(self, prompt_ids: Sequence[int]) -> tuple[KVSession, list[int]]:
        """A fresh session and the sequence decoding starts from (for a causal LM: the prompt)."""
        return KVSession(self), list(prompt_ids)

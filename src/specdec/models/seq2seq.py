"""Encoder-decoder models (T5, BART, Marian) behind the same interface as causal LMs.

Each model runs its encoder once per input; the decoder keeps a KV cache whose self-attention part
is rolled back on rejection while the cross-attention part (keys and values of the encoder output)
is kept as it is. The "sequence" that drafters and the decoding loop see is the decoder sequence,
which starts with the decoder start token; the prompt is the encoder input.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache, EncoderDecoderCache

from specdec.errors import SpecDecError
from specdec.models.causal import LanguageModel
from specdec.models.sessions.session import DynamicSession
from specdec.models.cache.kv_cache import cache_argument, preallocated_cache


class Seq2SeqSession(DynamicSession):
    def __init__(self, model: "Seq2SeqLanguageModel", source_ids: Sequence[int]):
        self.source_ids = list(source_ids)
        with torch.inference_mode():
            source = torch.tensor([self.source_ids], device=model.device)  # [1, S]
            self.encoder_outputs = model.hf_model.get_encoder()(input_ids=source)
        super().__init__(model)

    def _new_cache(self):
        config = self.model.hf_model.config
        # Self-attention: written in place and rolled back; cross-attention: filled once, never cropped.
        return EncoderDecoderCache(preallocated_cache(config), DynamicCache(config=config))

    def _run(self, new: torch.Tensor, n_logits: int) -> torch.Tensor:
        return self.model.hf_model(
            encoder_outputs=self.encoder_outputs, decoder_input_ids=new, use_cache=True,
            **cache_argument(self.model.hf_model, self.cache),
        ).logits


class Seq2SeqLanguageModel(LanguageModel):
    is_encoder_decoder = True

    wrong_kind = "this is not an encoder-decoder model; use specdec.load(), which picks the backend"

    def configure(self, engine: str | None = None, cuda_graphs: bool | None = None, compile: bool = False) -> None:
        """The encoder-decoder backend runs eagerly on its dynamic cache, on any device."""
        if engine not in (None, "dynamic") or cuda_graphs or compile:
            raise SpecDecError("encoder-decoder models run on the dynamic engine without CUDA graphs or compile")
        self.engine, self.cuda_graphs, self.compile = "dynamic", False, False

    @property
    def max_context(self) -> int | None:
        # T5's relative positions have no hard limit; BART and Marian have learned positions.
        return getattr(self.hf_model.config, "max_position_embeddings", None)

    @property
    def decoder_start_token_id(self) -> int:
        for source in (getattr(self.hf_model, "generation_config", None), self.hf_model.config):
            value = getattr(source, "decoder_start_token_id", None)
            if value is not None:
                return int(value)
        raise SpecDecError(f"{self.name} has no decoder_start_token_id in its config")

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            raise SpecDecError("chat=True is for decoder-only instruct models; an encoder-decoder model takes the text as it is")
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def start(self, prompt_ids: Sequence[int], max_positions: int | None = None) -> tuple[DynamicSession, list[int]]:
        """Encode the source once; the decoder sequence starts with the decoder start token."""
        return Seq2SeqSession(self, prompt_ids), [self.decoder_start_token_id]

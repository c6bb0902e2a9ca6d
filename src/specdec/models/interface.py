"""What every model specdec runs declares: :class:`Model`, the base of
:class:`~specdec.models.causal.LanguageModel` (and its encoder-decoder subclass) and of
:class:`~specdec.models.llama_cpp.LlamaCppModel`.

The decoding loop, the batch engine, the server and the CLI read these attributes directly, rather than
asking an object what it is with ``getattr``: a model type that leaves one out fails here, at its
definition, rather than as a wrong guess somewhere else.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Sequence

import torch


class Model(abc.ABC):
    """A language model with its tokenizer: what drafters, the loops, the server and the CLI read."""

    name: str
    tokenizer: Any  # the transformers tokenizer (llama.cpp models too: specdec compares vocabularies with it)
    vocab_size: int
    is_encoder_decoder: bool = False
    quantization: str | None = None  # None, "int8", "int8-tensor" (specdec.models.quantized.quantize) or "llama-cpp"
    # True when a k-token pass gives each position the logits of k one-token steps, bit for bit (the int8
    # models: Int8Linear layers and row-wise attention): such a target's speculative output is its plain one
    block_invariant: bool = False
    hf_model: Any = None  # the transformers module; None for a model outside torch (llama.cpp)
    engine: str = "dynamic"  # "dynamic", "static" (LanguageModel.configure) or "llama.cpp"
    cuda_graphs: bool = False
    load_seconds: float | None = None  # how long specdec.load took (conversion included); None: not loaded by it
    preset: str | None = None  # the preset it was loaded from (None: a folder, a file, an object)
    default_draft: Any = None  # its preset's default draft, loaded once on first use (specdec.config.preset_draft)

    @property
    @abc.abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abc.abstractmethod
    def max_context(self) -> int | None: ...

    @property
    @abc.abstractmethod
    def eos_token_ids(self) -> set[int]: ...

    @property
    def piece_bytes(self) -> Callable[[int], bytes] | None:
        """token id -> its UTF-8 bytes where the tokenizer allows it (stop strings scan bytes); None: decode text."""
        return None

    @abc.abstractmethod
    def encode(self, text: str, chat: bool = False) -> list[int]: ...

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abc.abstractmethod
    def start(self, prompt_ids: Sequence[int], max_positions: int | None = None) -> tuple[Any, list[int]]:
        """A session (prefill, extend, rollback, close) over the prompt, and the sequence it holds."""

"""Decoder-only (causal) language models behind specdec's small model interface.

A :class:`LanguageModel` pairs a Hugging Face model with its tokenizer and says how it runs: on
which device, with which cache (``engine``: "dynamic" or "static", see :mod:`specdec.models.sessions.session`),
with CUDA graphs or not, compiled or not. :meth:`LanguageModel.start` opens a session (one
sequence's KV cache) on it.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Callable, Sequence

import torch

from specdec.devices import module_device
from specdec.errors import SpecDecError
from specdec.models.sessions import graphs
from specdec.models.sessions.graphs import (
    MAX_GRAPH_WIDTH,
    PREFILL_BUCKETS,
    CapturedPrefill,
    CapturedStep,
    buckets_up_to,
    compiled_step,
    static_step,
)
from specdec.models.interface import Model
from specdec.models.cache.kv_cache import cache_keyword
from specdec.models.sessions.session import DynamicSession, ModelSession, StaticSession, common_prefix_length
from specdec.models.fused_linear import fuse_siblings
from specdec.models.cache.static_cache import MIN_CAPACITY, StaticKVCache, capacity_for
from specdec.text import fast_decoder, piece_bytes

ENGINES = ("dynamic", "static")

__all__ = ["LanguageModel", "DynamicSession", "ModelSession", "StaticSession", "common_prefix_length", "ENGINES"]


def context_length(config: Any) -> int | None:
    """The most positions a decoder-only model reads (its text config's ``max_position_embeddings``), or None."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text_config, "max_position_embeddings", None)


def encode_text(tokenizer: Any, text: str, chat: bool, name: str) -> list[int]:
    """``text`` as the model reads it: the tokenizer's ids (special tokens added), or with ``chat`` the ids
    of a one-message user turn through the model's chat template."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise SpecDecError(f"{name} has no chat template; drop chat=True (--chat) for this model")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):  # BatchEncoding in recent transformers
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def check_prompt_fits(n_tokens: int, max_context: int | None, name: str) -> None:
    """A prompt must have a token, and leave room for one new token in the model's context."""
    if not n_tokens:
        raise SpecDecError("the prompt is empty (no tokens); give some text to continue")
    if max_context is not None and n_tokens >= max_context:
        raise SpecDecError(f"the prompt has {n_tokens} tokens but {name} reads at most {max_context}; "
                           "shorten the prompt")


def new_token_limit(n_prompt: int, max_new_tokens: int, max_context: int | None, name: str) -> int:
    """How many tokens a generation may add: max_new_tokens, or fewer where the context ends first (the loop
    and beam search both ask here); the prompt is checked first (:func:`check_prompt_fits`)."""
    check_prompt_fits(n_prompt, max_context, name)
    return max_new_tokens if max_context is None else min(max_new_tokens, max_context - n_prompt)


class LanguageModel(Model):
    """A causal language model and its tokenizer, as used by drafters and the decoding loop. Unquantized
    until :mod:`specdec.models.quantized.quantize` sets ``quantization`` and ``block_invariant`` (defaults: :class:`Model`)."""

    #: What building this class from the other kind of model says (the seq2seq backend has its own).
    wrong_kind = "this is an encoder-decoder model; load it with specdec.load(), which picks the seq2seq backend"

    def __init__(self, hf_model: Any, tokenizer: Any, name: str | None = None):
        if bool(getattr(hf_model.config, "is_encoder_decoder", False)) != self.is_encoder_decoder:
            raise SpecDecError(self.wrong_kind)
        self.hf_model = hf_model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(hf_model.config, "_name_or_path", None) or type(hf_model).__name__
        self.configure()

    def configure(self, engine: str | None = None, cuda_graphs: bool | None = None, compile: bool = False) -> None:
        """How generations run on this model; the defaults follow its device.

        engine: "dynamic" (default on CPU: attention over exactly the filled cache) or "static"
          (default on CUDA: position-indexed buffers, fixed-shape steps).
        cuda_graphs: replay fixed-width steps as captured CUDA graphs (default: on CUDA with the
          static engine; needs CUDA). Its float sibling projections are then fused, q/k/v and gate/up as
          one GEMM each (:mod:`specdec.models.fused_linear`).
        compile: compile the step with inductor before capturing it (CUDA graphs only): faster
          steps, about a minute of compilation per step width and model.
        """
        on_cuda = self.device.type == "cuda"
        engine = engine or ("static" if on_cuda else "dynamic")
        if engine not in ENGINES:
            raise SpecDecError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if cuda_graphs is None:
            cuda_graphs = on_cuda and engine == "static"
        if cuda_graphs and not on_cuda:
            raise SpecDecError(f"CUDA graphs need the model on a CUDA device; {self.name} is on {self.device}")
        if cuda_graphs and engine != "static":
            raise SpecDecError("CUDA graphs need fixed shapes: use engine='static' with cuda_graphs=True")
        if compile and not cuda_graphs:
            raise SpecDecError("compile=True compiles the captured CUDA-graph steps: it needs a CUDA device")
        self.engine, self.cuda_graphs, self.compile = engine, bool(cuda_graphs), bool(compile)
        if self.cuda_graphs:  # batch-1 GPU steps are bound by kernel count: sibling projections as one GEMM each
            fuse_siblings(self.hf_model)
        if self.block_invariant:
            from specdec.models.native import lean_attention
            from specdec.models.native.row_attention import use_row_attention

            use_row_attention(self.hf_model)
            lean_attention.install(self.hf_model)  # where specdec's extension runs it: fewer ops, the same bits
        self._caches: list[tuple[StaticKVCache, bool]] = []  # (cache, in use): the static caches, reused
        self.capacity: int | None = None  # positions of every cache, fixed by prepare_steps (None: sized per generation)
        self._graph_pool: Any = None  # the CUDA graph memory pool all this model's captured steps share
        self._step = compiled_step() if self.compile else static_step

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
    def device(self) -> torch.device:
        return module_device(self.hf_model)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.hf_model.parameters())

    @property
    def max_context(self) -> int | None:
        return context_length(self.hf_model.config)

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
        return encode_text(self.tokenizer, text, chat, self.name)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens skipped: ``tokenizer.decode(ids, skip_special_tokens=True)``
        (through the Rust tokenizer where that is the same: :func:`specdec.text.fast_decoder`)."""
        return self._decode(ids if isinstance(ids, list) else list(ids))

    @functools.cached_property
    def _decode(self) -> Callable[[list[int]], str]:
        return fast_decoder(self.tokenizer)

    @functools.cached_property
    def piece_bytes(self) -> Callable[[int], bytes] | None:
        """token id -> its UTF-8 bytes where a byte-level tokenizer allows it (:func:`specdec.text.piece_bytes`)."""
        return piece_bytes(self.tokenizer)

    # -- decoding --------------------------------------------------------------------------------
    def start(self, prompt_ids: Sequence[int], max_positions: int | None = None) -> tuple[ModelSession, list[int]]:
        """A fresh session and the sequence decoding starts from (for a causal LM: the prompt).

        max_positions: the most positions the generation can reach (the static engine sizes its
        cache by it; None: the prompt plus MIN_CAPACITY).
        """
        session_class = StaticSession if self.engine == "static" else DynamicSession
        return session_class(self, max_positions), list(prompt_ids)

    def prepare_steps(self, max_positions: int | None = None, max_width: int | None = None) -> list[int]:
        """Fix the capture plan now (:mod:`specdec.models.sessions.graphs`): every cache holds ``max_positions``
        positions (default: the model's context) plus the widest padded step, and the width buckets up to
        that of ``max_width``, the widest step the plan runs (default: every bucket), are captured (and with
        ``compile``, compiled), largest first into one memory pool. Later generations of up to
        ``max_positions`` positions replay these graphs and capture nothing, so no capture (a compilation
        takes tens of seconds) lands inside a timed or waited-for generation; a longer one, or a wider
        step, runs eagerly. The prefill widths (``PREFILL_BUCKETS`` within the capacity) are captured too,
        not compiled: prompts run through them in chunks. Returns the captured buckets; a no-op without CUDA graphs."""
        if not self.cuda_graphs:
            return []
        positions = max_positions or self.max_context or MIN_CAPACITY
        capacity = positions + MAX_GRAPH_WIDTH
        buckets = buckets_up_to(max_width)
        ready = [c for c, used in self._caches
                 if c.prepared and c.capacity == capacity and c.graphs and set(buckets) <= set(c.graphs)]
        if capacity == self.capacity and ready:
            return sorted(ready[0].graphs)  # prepared already, for this capacity and these widths
        self.capacity = capacity
        self._caches = [(c, used) for c, used in self._caches if used]  # free caches of another plan go
        session = StaticSession(self, positions)
        session.cache.prepared = False  # until every bucket is captured
        try:
            session.prefill([0])  # one position (eager, allocates the buffers): steps run at positions >= 1
            cache = session.cache
            for width in sorted((w for w in PREFILL_BUCKETS if w <= cache.capacity), reverse=True):
                if width not in cache.prefills:  # widest first, like the steps: one pool, replays never overlap
                    prefill = CapturedPrefill(self.hf_model, cache, width, self.graph_pool())
                    prefill.capture()
                    cache.prefills[width] = prefill
            for width in reversed(buckets):  # largest first: the narrower graphs reuse its pool memory
                session.extend([0] * width, 1)
                session.rollback(1)
            session.cache.prepared = True
            return sorted(session.cache.graphs)
        finally:
            session.close()

    def acquire_cache(self, max_positions: int | None) -> StaticKVCache:
        """A free static cache with room for max_positions plus the widest padded step (kept for reuse:
        its captured graphs are tied to its buffers). On a prepared model (:meth:`prepare_steps`) a new
        cache has the fixed capacity, or more for a longer generation, and captures nothing: its steps run
        eagerly."""
        needed = (max_positions or MIN_CAPACITY) + MAX_GRAPH_WIDTH
        free = [c for c, used in self._caches if not used and c.capacity >= needed]
        if free:
            cache = min(free, key=lambda c: c.capacity)
        else:
            # A cache too small for this generation is dropped with its graphs rather than kept twice (the
            # prepared cache stays).
            self._caches = [(c, used) for c, used in self._caches if used or (c.prepared and c.graphs)]
            fixed = self.capacity is not None and needed <= self.capacity
            cache = StaticKVCache(self.hf_model.config, self.capacity if fixed else capacity_for(needed, None),
                                  self.device, self.dtype, cache_keyword(self.hf_model))
            cache.prepared = self.capacity is not None
        self._caches = [(c, used or c is cache) for c, used in self._caches] + ([] if free else [(cache, True)])
        return cache

    def release_cache(self, cache: StaticKVCache) -> None:
        self._caches = [(c, used and c is not cache) for c, used in self._caches]

    @property
    def step_function(self) -> Callable[..., Any]:
        """The fixed-shape step (:func:`~specdec.models.sessions.graphs.static_step`, or its compiled form with ``compile``)."""
        return self._step

    def graph_pool(self) -> Any:
        """The CUDA graph memory pool this model's captured steps and rounds share (made on first use)."""
        if self._graph_pool is None:
            self._graph_pool = graphs.memory_pool()
        return self._graph_pool

    def captured_step(self, cache: StaticKVCache, width: int) -> CapturedStep:
        """The step of ``width`` tokens on ``cache``, to be captured on its first call into the model's pool."""
        return CapturedStep(self._step, self.hf_model, cache, width, self.graph_pool())

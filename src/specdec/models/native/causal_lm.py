"""A Qwen2 / Llama-form causal LM for one sequence, built without transformers' modeling code: the same bits.

Importing transformers' modeling code (``modeling_utils`` and the model's module) takes about 1.9 s of a one-shot
``specdec generate`` on the AVX-512 EPYC, a third of its start-up, paid on every run; llama.cpp's own one-shot pays
nothing like it. For a stored int8 / int4 preset on specdec's kernels (the CPU default) the model needs little
of that code: its cached passes run through the decoder step (:mod:`specdec.models.native.decoder_step`), its attention is
specdec's row attention. This module builds the same module tree from the preset's config (transformers' attribute
names: ``model.embed_tokens``, ``model.layers[i].self_attn.q_proj`` .. ``mlp.down_proj``, the two norms,
``model.norm``, ``model.rotary_emb``, ``lm_head``), which :func:`specdec.models.formats.stored.load_quantized` fills with
the same layers and tensors it would put into transformers' model, and runs a pass with transformers' operations in
transformers' order (RMSNorm, the default rotary table, the lean attention's calls, SDPA's causal prefill through
transformers' own ``sdpa_attention_forward``): the logits are transformers' bit for bit
(tests/test_native_model.py), so a generation is the same tokens either way.

It runs one sequence on specdec's dynamic cache, without a mask: what ``specdec generate`` does (the CLI asks for it
with :func:`skeletons` around its loads). Batches, beams and the static engine need transformers' model: a pass of
theirs is refused with an error that says so.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from specdec.errors import SpecDecError
from specdec.models.native import lean_attention
MODEL_TYPES = ("qwen2", "llama")

#: The config attributes this module reads (a config written by transformers 5 holds them all).
_READ = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "rms_norm_eps", "vocab_size")

_WANTED: ContextVar[bool] = ContextVar("specdec_native_skeletons", default=False)


@contextlib.contextmanager
def skeletons() -> Iterator[None]:
    """Inside: a stored int8 / int4 preset whose architecture :func:`supported` accepts loads into this module's
    model (one sequence at a time), not transformers'."""
    token = _WANTED.set(True)
    try:
        yield
    finally:
        _WANTED.reset(token)


def wanted() -> bool:
    return _WANTED.get()


def supported(config: Any) -> bool:
    """Whether ``config`` describes a model this module builds with transformers' arithmetic: a Qwen2 or Llama
    causal LM with SiLU MLPs, the default rotary embedding, every layer full attention."""
    rope = getattr(config, "rope_parameters", None) or {}
    return (getattr(config, "model_type", None) in MODEL_TYPES
            and all(hasattr(config, name) for name in _READ)  # (a config.json without one: transformers' defaults)
            and getattr(config, "hidden_act", None) == "silu"
            and rope.get("rope_type", "default") == "default" and "rope_theta" in rope
            and not getattr(config, "is_encoder_decoder", False)
            and all(t == "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"]))


def _linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
    """A linear layer without memory (specdec.models.quantized.int8_fusion.put_layers replaces it, or checkpoint.fill fills it).
    Not initialized: torch's random initialization of a meta tensor imports torch._dynamo (1.5 s)."""
    layer = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(layer)
    layer.in_features, layer.out_features = n_in, n_out
    layer.weight = nn.Parameter(torch.empty(n_out, n_in, device="meta"), requires_grad=False)
    layer.register_parameter("bias", nn.Parameter(torch.empty(n_out, device="meta"), requires_grad=False) if bias else None)
    return layer


class NativeRMSNorm(nn.Module):
    """transformers' Qwen2RMSNorm / LlamaRMSNorm: the same operations in the same order."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device="meta"), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)  # [..., 1]
        hidden = hidden * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden.to(dtype)


class NativeRotary(nn.Module):
    """transformers' default rotary embedding: inverse frequencies 1 / theta^(2i / D), cos and sin per position."""

    def __init__(self, config: Any, head_dim: int):
        super().__init__()
        base = config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))  # [D / 2]
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)  # [B, L, D / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, L, D]
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class NativeAttention(nn.Module):
    """q/k/v, rotary, cache, row attention, o: the lean attention's forward (specdec.models.native.lean_attention)."""

    def __init__(self, config: Any, layer_idx: int, head_dim: int, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.config, self.layer_idx, self.head_dim = config, layer_idx, head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = head_dim ** -0.5
        self.is_causal = True
        self.sliding_window = None
        hidden, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.q_proj = _linear(hidden, heads * head_dim, qkv_bias)
        self.k_proj = _linear(hidden, kv * head_dim, qkv_bias)
        self.v_proj = _linear(hidden, kv * head_dim, qkv_bias)
        self.o_proj = _linear(heads * head_dim, hidden, o_bias)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any,
                position_ids: torch.Tensor) -> torch.Tensor:
        # transformers' layers pass position_ids and use_cache on to the cache and the attention function
        return lean_attention.lean_forward(self, hidden, (cos, sin), None, cache=cache, position_ids=position_ids,
                                           use_cache=True)[0]  # [B, L, hidden]


class NativeMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up as one call of their fused layer where they are one."""

    def __init__(self, config: Any, bias: bool):
        super().__init__()
        self.gate_proj = _linear(config.hidden_size, config.intermediate_size, bias)
        self.up_proj = _linear(config.hidden_size, config.intermediate_size, bias)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, bias)
        self.act_fn = nn.SiLU()

    forward = lean_attention.lean_mlp_forward


class NativeDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int, head_dim: int):
        super().__init__()
        llama = config.model_type == "llama"
        self.self_attn = NativeAttention(config, layer_idx, head_dim, qkv_bias=getattr(config, "attention_bias", False)
                                         if llama else True, o_bias=llama and getattr(config, "attention_bias", False))
        self.mlp = NativeMLP(config, bias=llama and getattr(config, "mlp_bias", False))
        self.input_layernorm = NativeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = NativeRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any,
                position_ids: torch.Tensor) -> torch.Tensor:
        residual = hidden
        hidden = residual + self.self_attn(self.input_layernorm(hidden), cos, sin, cache, position_ids)
        residual = hidden
        return residual + self.mlp(self.post_attention_layernorm(hidden))


class NativeBody(nn.Module):
    def __init__(self, config: Any, head_dim: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size, device="meta"))
        self.layers = nn.ModuleList(NativeDecoderLayer(config, i, head_dim) for i in range(config.num_hidden_layers))
        self.norm = NativeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = NativeRotary(config, head_dim)


@dataclass
class NativeOutput:
    logits: torch.Tensor  # [1, n, V]


class NativeCausalLM(nn.Module):
    """The causal LM of ``config`` (see the module docstring): transformers' attribute names and the few methods of
    its model that specdec calls, a forward for one sequence on specdec's dynamic cache."""

    native = True  # (specdec.models.native.row_attention: no registration in transformers' registries needed)

    def __init__(self, config: Any):
        super().__init__()
        if not supported(config):
            raise SpecDecError(f"specdec's native model builds {', '.join(MODEL_TYPES)} models with SiLU, the default "
                               f"rotary embedding and full attention; this config is {config.model_type!r}")
        self.config = config
        self.generation_config = None  # (checkpoint.fill reads the folder's)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.model = NativeBody(config, head_dim)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, False)

    # -- transformers' model methods that specdec uses ------------------------------------------
    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, module: nn.Module) -> None:
        self.model.embed_tokens = module

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, module: nn.Module) -> None:
        self.lm_head = module

    def tie_weights(self) -> None:
        if getattr(self.config, "tie_word_embeddings", False) and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_attn_implementation(self, name: str) -> None:
        self.config._attn_implementation = name

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = True,
                logits_to_keep: int = 0, **kwargs: Any) -> NativeOutput:
        """Logits [1, n, V] of the last ``logits_to_keep`` (0: all) of ``input_ids`` [1, k] after the positions
        ``cache`` holds (specdec's dynamic cache; written)."""
        from specdec.models.native import row_attention
        from specdec.models.cache.kv_cache import PreallocatedLayer

        cache = cache if cache is not None else kwargs.pop("past_key_values", None)
        refused = ("no input ids" if input_ids is None else
                   f"a batch of {input_ids.shape[0]} sequences" if input_ids.shape[0] != 1 else
                   "an attention mask" if attention_mask is not None else
                   "given position ids" if position_ids is not None else
                   f"the arguments {sorted(kwargs)}" if kwargs else
                   "a ragged batch" if row_attention._BATCH_ROWS.get() is not None else
                   "a pass without specdec's dynamic cache (the static engine, or none)" if not use_cache or not all(
                       isinstance(layer, PreallocatedLayer) for layer in getattr(cache, "layers", None) or [None]) else
                   "a model without specdec's row attention" if getattr(self, row_attention.KERNEL_ATTRIBUTE, None) is None
                   else None)
        if refused is not None:
            raise SpecDecError(f"{refused}: this model is specdec's native model (specdec.models.native.causal_lm: one sequence "
                               "on the dynamic cache, as `specdec generate` runs it); batches, beams and the static "
                               "engine need transformers' model: load it with specdec.load() outside "
                               "specdec.models.native.causal_lm.skeletons()")
        body, k = self.model, int(input_ids.shape[1])
        hidden = body.embed_tokens(input_ids)  # [1, k, H]
        position_ids = (torch.arange(k, device=hidden.device) + cache.get_seq_length())[None]  # [1, k]
        cos, sin = body.rotary_emb(hidden, position_ids)  # [1, k, D] each
        for layer in body.layers:
            hidden = layer(hidden, cos, sin, cache, position_ids)  # [1, k, H]
        hidden = body.norm(hidden)
        return NativeOutput(self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden))  # [1, n, V]


def read_config(folder: Any) -> Any:
    """``folder``'s config.json as transformers' generic ``PreTrainedConfig``: for a preset's config (written whole
    by transformers at conversion) the attributes ``AutoConfig`` gives (tested), without importing the package of
    every model's config classes (0.3-0.5 s a process)."""
    import json
    from pathlib import Path

    from transformers import PreTrainedConfig

    config = PreTrainedConfig.from_dict(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))
    config._name_or_path = str(folder)
    return config


def model_for(folder: Any) -> NativeCausalLM | None:
    """The empty native model of the preset folder ``folder`` (its config), or None where this module does not
    build it (another architecture, or linear layers not on specdec's kernels: transformers' model then)."""
    from specdec.models.kernels import int8_matmul

    config = read_config(folder)
    if not supported(config) or int8_matmul.chosen() != "specdec":
        return None
    return NativeCausalLM(config)

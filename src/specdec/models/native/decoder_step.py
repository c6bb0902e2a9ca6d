"""A decoding step of an int8 / int4 model as one call into specdec's extension: the same bits, without the Python.

A step of the 0.5B draft in int4 took 18 ms on the AVX-512 EPYC, of which 11 in its matrix kernels and 7 in
transformers' modules around them (a few hundred small ops and their Python, per step). For a Qwen2 or Llama-form
model whose linear layers all run on specdec's extension (int8 or int4) and whose attention is specdec's row
attention there, :func:`step` runs the new tokens of a cached step or a verification pass through every decoder
layer in one extension call (``csrc/decoder_step.cpp``): each layer makes the calls the Python path makes
(transformers' RMSNorm, SiLU and residual ops as ATen ops, the extension's GEMMs, rotary and row attention) in the
same order on the same shapes, so the logits are the Python path's bit for bit (tests/test_decoder_step.py), and
every exactness property of the model stands. The embedding, the rotary table, the final norm and the LM head stay
transformers' modules (once per step). The RMSNorms and the residual adds before them run in one pass a row
(``csrc/rms_norm.h``, ATen's summation order reproduced: :func:`norm_lanes` checks the bits against the model's own
norm when the step is built, else the ATen ops run): a dozen ATen calls a layer fewer, 0.93-0.95x the 0.5B's step
and 0.96-0.98x the 1.5B's on the AVX2 EPYC.

:func:`step_packed` does the same for a batch of sequences
(:class:`~specdec.models.sessions.batch_session.BatchSession`, each at its own length), packed into one pass without
padding: what transformers' padded forward computes there with the row attention's ragged spans, the same bits, so a
batched row still equals the sequence alone, at the cost of the tokens fed (a row of 30 predicted tokens beside plain
rows no longer makes every row 31 wide).

Anything else (a pass from position 0 of the one-sequence engine, another architecture, a sliding window, a float
model, a layer switched to torch's per-pass scale) runs transformers' forward: :func:`step` and :func:`step_packed`
return None there.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.models.kernels import extension

from specdec.models.native import lean_attention

from specdec.models.native import row_attention

from specdec.models.kernels import threads
from specdec.models.quantized.int4 import Int4Weight
from specdec.models.quantized.int8_fusion import Int8Slice, fused_set
from specdec.models.quantized.int8_linear import Int8Linear
from specdec.models.quantized.int8_packed import PackedInt8Weight
from specdec.models.cache.kv_cache import PreallocatedLayer

#: The decoder layers, norms and activation this step reproduces (transformers' classes of the plain Llama form).
LAYERS = ("Qwen2DecoderLayer", "LlamaDecoderLayer", "NativeDecoderLayer")  # (the last: specdec.models.native.causal_lm's)
NORMS = ("Qwen2RMSNorm", "LlamaRMSNorm", "NativeRMSNorm")
ATTENTIONS = lean_attention.SUPPORTED + ("NativeAttention",)
MLPS = lean_attention.SUPPORTED_MLPS + ("NativeMLP",)
ACTIVATIONS = ("SiLUActivation", "SiLU")  # (both are F.silu)

_ATTRIBUTE = "_specdec_decoder_step"  # on the decoder stack (shared by a model's copies): the step, or False


def _linear(layer: Int8Linear, widths: list[int]) -> tuple | None:
    """The extension's arguments for ``layer`` (int8 or int4 on specdec's int8 kernel) with output parts ``widths``."""
    if layer.kernel != "specdec" or not layer.pinned:
        return None
    layer.wait_packed()
    w, bias = layer._packed, layer.bias
    if isinstance(w, Int4Weight):
        return 4, [w.packed, w.dmins, w.scs], bias, w.out_features, widths
    if isinstance(w, PackedInt8Weight):
        return 8, [w.packed, w.colsum128, w.scales_per_q], bias, w.out_features, widths
    return None


def _group(modules: list[Any]) -> list[tuple] | None:
    """The linear calls that give ``modules``' outputs in order (one per fused set, one per other layer)."""
    fused = fused_set(modules)
    if fused is not None:
        if any(start % extension.GROUP for start, _ in fused.bounds):
            return None
        one = _linear(fused.layer, list(fused.widths))
        return None if one is None else [one]
    out = []
    for m in modules:
        one = _linear(m, [m.out_features]) if isinstance(m, Int8Linear) and not isinstance(m, Int8Slice) else None
        if one is None:
            return None
        out.append(one)
    return out


def _build(hf_model: Any) -> Any:
    """The extension's DecoderStep for ``hf_model``'s decoder stack, or None where this path does not apply."""
    body, config = getattr(hf_model, "model", None), hf_model.config
    layers = getattr(body, "layers", None)
    if (layers is None or getattr(hf_model, row_attention.KERNEL_ATTRIBUTE, None) is None
            or getattr(config, "hidden_act", None) != "silu"
            or any(t != "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"])):
        return None
    step, kernels = None, []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if (type(layer).__name__ not in LAYERS or type(layer.input_layernorm).__name__ not in NORMS
                or type(layer.post_attention_layernorm).__name__ not in NORMS
                or _base_name(attn) not in ATTENTIONS or _base_name(mlp) not in MLPS
                or type(getattr(mlp, "act_fn", None)).__name__ not in ACTIVATIONS
                or getattr(attn, "sliding_window", None) or not hasattr(mlp, "gate_proj")):
            return None
        qkv = _group([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up = _group([mlp.gate_proj, mlp.up_proj])
        o, down = _group([attn.o_proj]), _group([mlp.down_proj])
        if qkv is None or gate_up is None or o is None or down is None:
            return None
        if step is None:
            step = extension.loaded().DecoderStep(attn.head_dim, float(attn.scaling))
        norm_in, norm_post = layer.input_layernorm, layer.post_attention_layernorm
        step.add_layer(norm_in.weight.detach(), float(norm_in.variance_epsilon), norm_post.weight.detach(),
                       float(norm_post.variance_epsilon), qkv, o[0], gate_up, down[0])
        kernels += [m.fused.layer if isinstance(m, Int8Slice) else m
                    for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
    if step is not None:
        step.set_norm_lanes(norm_lanes(layers[0].input_layernorm))
        step.kernel_layers = list({id(k): k for k in kernels}.values())  # what step() checks is still pinned
        step.head_dim = attn.head_dim
    return step


def norm_lanes(norm: Any) -> int:
    """The vector width (8 or 16) whose sums make the extension's RMSNorm (``csrc/rms_norm.h``: the norm and the
    residual add in one pass a row) give the bits of ``norm``'s ATen ops on this machine, or 0 (the decoder step then
    calls the ATen ops). ATen sums a row in vectors of its CPU capability's width; the check runs both widths on rows
    of several scales, lengths and tails against ``norm`` itself and keeps a width only where every bit agrees."""
    weight, eps = norm.weight.detach(), float(norm.variance_epsilon)
    if weight.dtype != torch.float32:
        return 0
    hidden = weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(1, 67, hidden, generator=generator)  # [1, 67, H]: one-token steps and prefills alike
    rows = rows * torch.logspace(-3, 3, 67)[None, :, None]  # (small and large rows, as hidden states have)
    rows[0, 5, :7] = 1e4  # (an outlier dimension)
    with torch.no_grad():
        expected = [norm(rows[:, :1]), norm(rows[:, 1:4]), norm(rows)]
    ext = extension.loaded()
    for lanes in (8, 16):
        got = [ext.rms_norm_lanes(r, weight, eps, lanes).view(r.shape) for r in (rows[:, :1], rows[:, 1:4], rows)]
        if all(torch.equal(g, e) for g, e in zip(got, expected)):
            return lanes
    return 0


def _base_name(module: Any) -> str:
    """The transformers class name of ``module`` (lean_attention's subclasses named by their base)."""
    cls = type(module)
    return cls.__bases__[0].__name__ if cls.__name__.startswith("Lean") else cls.__name__


def decoder_step(hf_model: Any) -> Any:
    """``hf_model``'s DecoderStep (built on first use, when its int8 weights are packed), or None."""
    body = getattr(hf_model, "model", None)
    if body is None:
        return None
    found = getattr(body, _ATTRIBUTE, None)
    if found is None:
        found = _build(hf_model) or False
        object.__setattr__(body, _ATTRIBUTE, found)
    return found or None


def set_enabled(hf_model: Any, enabled: bool) -> None:
    """Use the decoder step for ``hf_model`` (and its copies: the default where it applies) or not (transformers'
    forward for every pass: for comparisons and measurements)."""
    body = getattr(hf_model, "model", None)
    if body is not None:
        object.__setattr__(body, _ATTRIBUTE, None if enabled else False)


def _runner(hf_model: Any, n_layers: int) -> Any:
    """``hf_model``'s DecoderStep where a pass of it may run now (the row attention on, every kernel still pinned, one
    layer per cache layer), else None."""
    if hf_model.training or hf_model.config._attn_implementation != row_attention.NAME:
        return None
    runner = decoder_step(hf_model)
    if runner is None or runner.layers() != n_layers or not all(k.pinned for k in runner.kernel_layers):
        return None  # (a layer switched to torch's per-pass scale since the build: transformers' forward)
    return runner


def step(hf_model: Any, cache: Any, ids: torch.Tensor, n_logits: int) -> torch.Tensor | None:
    """Logits [1, n_logits, V] of the new tokens ``ids`` [1, k] after the positions ``cache`` (specdec's preallocated
    DynamicCache) holds, its buffers written; None where this path does not apply (the caller runs the forward)."""
    layers = getattr(cache, "layers", None)
    if (not layers or not all(isinstance(layer, PreallocatedLayer) for layer in layers)
            or not getattr(layers[0], "is_initialized", False) or not layers[0].length
            or row_attention._BATCH_ROWS.get() is not None):
        return None
    runner = _runner(hf_model, len(layers))
    if runner is None:
        return None
    body, length, k = hf_model.model, layers[0].length, int(ids.shape[1])
    end = length + k
    if any(layer.length != length for layer in layers):
        return None
    with threads.serial_pass(hf_model, k):
        hidden = body.embed_tokens(ids)  # [1, k, H]
        position_ids = torch.arange(length, end)[None]  # [1, k]
        cos, sin = body.rotary_emb(hidden, position_ids)  # [1, k, D] each
        if hidden.dtype != torch.float32 or cos.shape != (1, k, runner.head_dim):
            return None
        for layer in layers:
            layer.reserve(end)
        hidden = runner.forward(hidden, cos, sin, [layer._key_buffer for layer in layers],
                                [layer._value_buffer for layer in layers], length, extension.amx_from(),
                                threads.kernel_threads() or 0)  # [1, k, H]
        for layer in layers:
            layer.filled(end)
        hidden = body.norm(hidden)
        return hf_model.lm_head(hidden[:, -n_logits:])  # [1, n_logits, V]


def step_packed(hf_model: Any, cache: Any, active: slice, feeds: list[torch.Tensor], lengths: list[int],
                n_logits: list[int]) -> list[torch.Tensor] | None:
    """A batch pass with its sequences packed, no padding: sequence b (row b of ``cache``'s rows ``active``: specdec's
    StaticKVCache, [R, H_kv, C, D] buffers, every one allocated) is fed ``feeds[b]`` ([m_b] long, m_b may be 0) after
    its ``lengths[b]`` positions; its keys and values written in its row. Returns per sequence the logits
    [n_logits[b], V] of its last n_logits[b] tokens, the bits transformers' padded batch pass gives (every op row by
    row, each token's attention over its own prefix), at the cost of the tokens fed, not rows x the widest; None
    where this path does not apply (the caller runs the forward)."""
    keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
    if (not keys or any(k is None for k in keys) or any(v is None for v in values) or any(cache.windows)
            or not feeds or feeds[0].device.type != "cpu"):
        return None
    runner = _runner(hf_model, len(keys))
    if runner is None:
        return None
    counts = [int(f.shape[0]) for f in feeds]
    if not any(counts):
        return None
    keys, values = [k[active] for k in keys], [v[active] for v in values]  # [B, H_kv, C, D] views
    body = hf_model.model
    ids = torch.cat([f for f in feeds if f.shape[0]])[None]  # [1, M]
    positions = torch.cat([torch.arange(start, start + m) for start, m in zip(lengths, counts) if m])[None]  # [1, M]
    with threads.serial_pass(hf_model, max(counts)):  # (the widest sequence decides, as for a padded pass)
        hidden = body.embed_tokens(ids)  # [1, M, H]
        cos, sin = body.rotary_emb(hidden, positions)  # [1, M, D] each
        if hidden.dtype != torch.float32 or cos.shape != (1, ids.shape[1], runner.head_dim):
            return None
        hidden = runner.forward_packed(hidden, cos, sin, keys, values, list(lengths), counts, extension.amx_from(),
                                       threads.kernel_threads() or 0)  # [1, M, H]
        hidden = body.norm(hidden)
        ends = torch.tensor(counts).cumsum(0).tolist()
        rows = [torch.arange(end - n, end) for end, n in zip(ends, n_logits) if n]
        logits = hf_model.lm_head(hidden[:, torch.cat(rows)])[0] if rows else None  # [sum n_logits, V]
    out, at, vocab = [], 0, 0 if logits is None else logits.shape[-1]
    for n in n_logits:
        out.append(logits[at: at + n] if n else hidden.new_zeros(0, vocab))
        at += n
    return out


def packs(hf_model: Any, windows: list) -> bool:
    """Whether a batch session of ``hf_model`` (its layers' sliding ``windows``) packs its passes
    (:func:`step_packed`): a pass then costs the tokens it feeds, not rows x the widest."""
    return not any(windows) and _runner(hf_model, len(windows)) is not None

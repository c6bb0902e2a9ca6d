"""SmoothQuant-style smoothing before int8 quantization (Xiao et al., 2023): an experiment of issue 39, point 3.

An int8 target quantizes each activation row with one scale (its largest magnitude), so a few outlier input
channels leave the others few levels. Smoothing divides input channel j of a linear layer by s_j and multiplies the
weight's column j by it, the same function in real arithmetic, with

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)

(max|X_j| over calibration text, max|W_j| over the weight rows of every layer reading that input). The division
is folded into what writes the input: the RMSNorm's weight before q / k / v and before gate / up, up_proj's rows
before down_proj, v_proj's rows before o_proj (per key/value head: every query head of a group shares them). The
output layer is left alone. Works on Qwen2 and Llama blocks (the attribute names of transformers' models); the bits
of the int8 kernel are unchanged, only its weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specdec.errors import SpecDecError


@torch.no_grad()
def activation_maxima(hf, batches: Iterable[torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{linear layer name: max |x| per input channel [in]}`` over forward passes of ``hf`` on ``batches`` (token
    ids ``[1, T]`` each), float32."""
    maxima: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, args):
            x = args[0].detach().float().abs().reshape(-1, args[0].shape[-1]).amax(dim=0)  # [in]
            maxima[name] = x if name not in maxima else torch.maximum(maxima[name], x)
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in hf.named_modules() if isinstance(m, torch.nn.Linear)]
    try:
        for ids in batches:
            hf(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return maxima


def scales(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = max|X| ** alpha / max|W| ** (1 - alpha), per input channel (any shape, the same for both)."""
    return (x_max.clamp(min=1e-5).pow(alpha) / w_max.clamp(min=1e-5).pow(1 - alpha)).clamp(min=1e-5)


def column_maxima(weights: list[torch.Tensor]) -> torch.Tensor:
    """max |W| [in] per column over every weight [out, in] given (the layers that read one input)."""
    return torch.stack([w.detach().float().abs().amax(dim=0) for w in weights]).amax(dim=0)


@torch.no_grad()
def _scale_columns(linear, s: torch.Tensor) -> None:
    linear.weight.mul_(s.to(linear.weight.dtype)[None, :])


@torch.no_grad()
def _divide_rows(linear, s: torch.Tensor) -> None:
    linear.weight.div_(s.to(linear.weight.dtype)[:, None])
    if linear.bias is not None:
        linear.bias.div_(s.to(linear.bias.dtype))


PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
CALIBRATED = ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")  # whose inputs are smoothed


def _check_block(block, name: str, maxima: dict[str, torch.Tensor]) -> None:
    def has(part: str) -> bool:
        try:
            block.get_submodule(part)
            return True
        except AttributeError:
            return False

    missing = [p for p in PARTS if not has(p)]
    if missing:
        raise SpecDecError(f"smoothing knows Qwen2 and Llama blocks; {name} has no {', '.join(missing)}")
    missing = [p for p in CALIBRATED if f"{name}.{p}" not in maxima]
    if missing:
        raise SpecDecError(f"no calibration maxima for {name}'s {', '.join(missing)}: run activation_maxima on this "
                           "model first")


@torch.no_grad()
def smooth(hf, maxima: dict[str, torch.Tensor], alpha: float = 0.5) -> int:
    """Smooth every decoder block of ``hf`` in place with the calibration ``maxima`` (:func:`activation_maxima`);
    returns how many layers' inputs were smoothed."""
    if not 0.0 <= alpha <= 1.0:
        raise SpecDecError(f"smoothing's alpha must be in [0, 1], got {alpha}")
    prefix = next((n for n, _ in hf.named_modules() if n.endswith("layers")), None)
    if prefix is None:
        raise SpecDecError("smoothing needs a model with decoder blocks under '...layers' (Qwen2, Llama)")
    config = hf.config
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    group = heads // kv_heads  # query heads per key/value head
    done = 0
    for i, block in enumerate(hf.get_submodule(prefix)):  # every block checked before any is changed
        _check_block(block, f"{prefix}.{i}", maxima)
    for i, block in enumerate(hf.get_submodule(prefix)):
        name = f"{prefix}.{i}"
        attn, mlp = block.self_attn, block.mlp
        qkv, gate_up = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
        for norm, linears, first in ((block.input_layernorm, qkv, "self_attn.q_proj"),
                                     (block.post_attention_layernorm, gate_up, "mlp.gate_proj")):
            s = scales(maxima[f"{name}.{first}"], column_maxima([lin.weight for lin in linears]), alpha)  # [hidden]
            norm.weight.div_(s.to(norm.weight.dtype))
            for lin in linears:
                _scale_columns(lin, s)
            done += len(linears)
        s = scales(maxima[f"{name}.mlp.down_proj"], column_maxima([mlp.down_proj.weight]), alpha)  # [intermediate]
        _divide_rows(mlp.up_proj, s)
        _scale_columns(mlp.down_proj, s)
        # o_proj's input channel (query head h, dim d) is value channel (h // group, d): one s per value channel
        x = maxima[f"{name}.self_attn.o_proj"].view(kv_heads, group, head_dim).amax(dim=1)  # [kv_heads, head_dim]
        w = column_maxima([attn.o_proj.weight]).view(kv_heads, group, head_dim).amax(dim=1)  # [kv_heads, head_dim]
        s_kv = scales(x, w, alpha)  # [kv_heads, head_dim]
        _divide_rows(attn.v_proj, s_kv.reshape(-1))
        _scale_columns(attn.o_proj, s_kv[:, None, :].expand(kv_heads, group, head_dim).reshape(-1))
        done += 2
    return done

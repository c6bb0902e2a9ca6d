"""What :func:`specdec.models.load` checks before it reads a weight, each check available on its own (the CLI
runs them on every model it was given before loading the first): the dtype, the quantization method and
its device, what a model name refers to, and a prompt against the model's tokenizer and context.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import torch

from specdec.devices import resolve_device
from specdec.errors import SpecDecError
from specdec.models.vocabulary import auto_tokenizer, preset_tokenizer

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
    """The dtype :func:`~specdec.models.load` gives a model loaded by name with these options."""
    # Dynamic int8 runs with float32 activations: load float32 weights so nothing is rounded twice.
    return torch.float32 if quantize else parse_dtype(dtype)


def preset_names() -> list[str]:
    from specdec.models.formats.catalog import PRESETS

    return list(PRESETS)


def source_kind(source: str | os.PathLike) -> str:
    """What a model name given to :func:`~specdec.models.load` refers to, found without loading anything: "preset",
    "gguf" (an existing .gguf file), "folder" (a Hugging Face model folder) or "hub" (an owner/name id).

    Raises a :class:`SpecDecError` that names the problem and what is expected otherwise: a missing
    .gguf file, a file where a folder is expected, a folder without config.json, or an unknown name.
    """
    text = str(source)
    path = Path(text).expanduser()
    expected = "a preset name, a Hugging Face model folder (with config.json), a .gguf file or a hub id (owner/name)"
    if text in preset_names():
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
    close = difflib.get_close_matches(text, preset_names(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise SpecDecError(
        f"unknown model {text!r}: not a preset, an existing path or a hub id (owner/name).{hint} "
        f"Presets: {', '.join(preset_names())}."
    )


def check_load(source: str | os.PathLike, *, dtype: str | torch.dtype | None = None, quantize: str | None = None,
               device: str | torch.device | None = None) -> str:
    """Every check :func:`~specdec.models.load` makes before it reads a weight: the dtype, the quantization method and
    its device, the device, and what ``source`` names (see :func:`source_kind`, whose answer it returns).
    The CLI runs it on every model it was given before loading the first."""
    parse_dtype(dtype)
    check_quantize(quantize, resolve_device(device) if device is not None else None)
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
        from specdec.models.formats.presets import converted_folder

        folder = converted_folder(str(source))
    else:
        folder = Path(str(source)).expanduser() if kind == "folder" else None
    if folder is None:
        return None
    from specdec.models.native import causal_lm

    if kind == "preset" and causal_lm.wanted():  # (`specdec generate`: its config without transformers' auto classes)
        config = causal_lm.read_config(folder)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(folder)
    if getattr(config, "is_encoder_decoder", False):
        return None  # the seq2seq backend has its own context rules and refuses chat itself
    tokenizer = preset_tokenizer(folder, auto_tokenizer) if kind == "preset" else auto_tokenizer(folder)
    check_prompt_fits(len(encode_text(tokenizer, prompt, chat, str(source))), context_length(config), str(source))
    return tokenizer


LLAMA_CPP = "llama-cpp"  # quantize= value: the model's GGUF run by llama.cpp (drafts only)


def check_quantize(quantize: str | None, device: torch.device | None) -> None:
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
    from specdec.models.quantized.int8_weights import check_method

    check_method(quantize)
    from specdec.models.quantized.int4 import check_cpu

    check_cpu(quantize)
    if (device or resolve_device("auto")).type != "cpu":
        raise SpecDecError(f"quantize={quantize!r} (specdec's int8 / int4 kernels) runs on CPU only; on a GPU load the draft in bf16 "
                           "(drop --draft-quantize / quantize=) or pass device='cpu'")

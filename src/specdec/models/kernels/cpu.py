"""The processor: its model name, its flags (Linux: /proc/cpuinfo) and what kind of CPU it is for matrix kernels.
The one place that reads and classifies them: reports (:func:`cpu_kind`), which of specdec's kernel codes can run
(:func:`kernel_code`; :func:`specdec.models.kernels.extension.kernel_isa` adds what the process asks for:
``ATEN_CPU_CAPABILITY``, ``SPECDEC_KERNELS``) and whether it has AMX tiles (:func:`has_amx`: llama.cpp's loader)."""

from __future__ import annotations

import functools
import platform


@functools.lru_cache(maxsize=None)
def cpuinfo() -> tuple[str | None, frozenset[str]]:
    """The processor's model name and flags from /proc/cpuinfo (Linux); (None, no flags) elsewhere."""
    model, flags = None, frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and model is None:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def cpu_model() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux), else what platform knows."""
    return cpuinfo()[0] or platform.processor() or platform.machine()


#: What each of specdec's kernel codes needs (csrc/: the AVX-512 files, and the AVX2 ones).
AVX512_CODE = frozenset({"avx512f", "avx512bw", "avx512_vnni"})
AVX2_CODE = frozenset({"avx2", "fma", "f16c"})


def _flags(flags) -> frozenset[str]:
    return cpuinfo()[1] if flags is None else frozenset(flags)


def kernel_code(flags=None, avx512: bool = True) -> str | None:
    """Which of specdec's kernel codes a CPU with ``flags`` (this one's when None) runs: ``"avx512"`` (AVX-512
    VNNI), ``"avx2"`` (AVX2 with FMA and F16C, no AVX-512 VNNI; or with it, ``avx512=False``) or None."""
    flags = _flags(flags)
    if avx512 and AVX512_CODE <= flags:
        return "avx512"
    return "avx2" if AVX2_CODE <= flags else None


#: The flags under which oneDNN's u8 x s8 int8 GEMM sums in int32 exactly (vpdpbusd, or AMX tiles).
ONEDNN_EXACT = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def onednn_int8_exact(flags=None, machine: str | None = None) -> bool:
    """Whether oneDNN's int8 GEMM gives the exact integer product here: on x86 only with VNNI or AMX (without them it
    multiplies pairs with vpmaddubsw, whose int16 sums saturate: on an AVX2-only EPYC its products were off by up to
    9% of an element, 2026-12-07); on other machines (ARM builds of torch, where fbgemm is missing) as measured there."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i686", "x86"):
        return True
    return bool(ONEDNN_EXACT & _flags(flags))


def has_amx(flags=None) -> bool:
    """Whether the CPU (``flags``, this one's when None) has AMX tiles."""
    return "amx_tile" in _flags(flags)


#: The instruction sets that decide CPU speed here, as /proc/cpuinfo names them, and how reports name them.
_KINDS = (("amx_tile", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512_vnni", "AVX-512 VNNI"),
          ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def cpu_kind(flags: set[str] | None = None) -> str:
    """What kind of CPU this is for matrix kernels: its best instruction sets, e.g. ``"AVX-512 BF16, AVX-512
    VNNI"`` or ``"AVX2 only"`` (bf16 verification is dear without AVX-512 BF16 or AMX: docs/int8_target.md
    and docs/benchmarks.md). ``flags``: /proc/cpuinfo's (read here when None); "unknown" where there are none."""
    flags = _flags(flags)
    have = [name for flag, name in _KINDS if flag in flags]
    if not have:
        return "unknown"
    if have == ["AVX2"]:
        return "AVX2 only"
    specific = [name for name in have if name not in ("AVX-512", "AVX2")]  # AVX-512 BF16 implies AVX-512
    return ", ".join(specific or [have[0]])

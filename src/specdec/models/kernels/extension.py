"""specdec's own int8 GEMM for CPUs with AVX-512 VNNI (``csrc/int8_gemm_avx512.cpp``; its row attention in
``csrc/attention_avx512.cpp``): the ``specdec`` int8 kernel. On a CPU with AVX2 but no AVX-512 VNNI the same functions run
their AVX2 code (``csrc/gemm_avx2.cpp``: exact integer sums, the same float operations lane for lane, so the same
bits; :func:`kernel_isa`).

fbgemm's int8 GEMM reads its weights once per few rows, so an 8-token verification pass of the int8 1.5B cost
1.5-1.7x a one-token step on the AMX Xeon; oneDNN's AMX GEMM is flat in the rows but streams its weights at
half fbgemm's rate in a pass (docs/int8_kernels.md). This kernel keeps up to 8 activation rows in registers
while it streams a weight once, with ``vpdpbusd`` (AVX-512 VNNI) for the int8 products: a pass of gamma + 1
tokens reads the weights once, as a one-token step does. Where the CPU has AMX, passes of :data:`AMX_FROM` rows or
more run on AMX tiles over the same layout (16 times the products per instruction, the same exact int32 sums, so the
same bits): an 8-token pass of the int8 1.5B costs 1.07x a one-token step on the AMX Xeon, and a prefill half.

Its bits are the oneDNN path's (:class:`specdec.models.kernels.int8_matmul.OnednnWeight`): each row quantized on its
own to round(x * (1 / max|x|) * 127), exact int32 accumulation, output scaled elementwise,
``(float(acc) * (w_scale / 127)) * row_scale + bias``. A row's output depends on its own input row only, so
the int8 model stays block-invariant (tests/test_quantize.py, tests/test_int8_kernel.py).

The extension is compiled on first use (about 40-80 s, once per machine, announced on stderr, with a progress line)
with the C++ compiler torch's extensions use, in a folder keyed by the content of its sources, its flags and torch's
version, then imported from there by every process, checkout and venv (:mod:`specdec.models.kernels.build`). Without
a compiler, on a CPU with neither AVX-512 VNNI nor AVX2, or with ``SPECDEC_KERNELS=off``, the kernel is unavailable:
:func:`usable_isa` says so once and the defaults run without it (:func:`specdec.models.formats.catalog.default_target_quantize`;
:func:`specdec.models.kernels.int8_matmul.chosen` falls back to fbgemm).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator, Sequence

from specdec.errors import SpecDecError

#: The extension's sources: the int8 GEMM (and the module's bindings), the int4 GEMM, the row attention, the decoder
#: step, their AVX2 code; and the headers they share (in the build's name hash, not compiled alone).
SOURCES = [Path(__file__).parent / "csrc" / name
           for name in ("int8_gemm_avx512.cpp", "int4_gemm_avx512.cpp", "attention_avx512.cpp", "decoder_step.cpp", "gemm_avx2.cpp",
                        "attention_avx2.cpp")]
HEADERS = [Path(__file__).parent / "csrc" / name
           for name in ("output_parts.h", "amx_tiles.h", "attention_pairs.h", "attention_rows.h", "avx2_lanes.h",
                        "work_items.h", "rms_norm.h")]
#: Output columns per packed group and input columns per 32-bit lane (the kernel's layout).
GROUP, LANE = 32, 4
#: Passes of at least this many rows run on AMX tiles where the CPU has them (the same bits: exact int32 sums);
#: ``SPECDEC_INT8_AMX_FROM`` overrides it (0: never, for the int4 GEMM too, whose tiles start at 16 rows).
AMX_FROM = 2

_lock = threading.Lock()
_extension = None
_failure: str | None = None


def kernel_isa() -> str | None:
    """The code the extension runs on this CPU (Linux: /proc/cpuinfo's flags): ``"avx512"`` (AVX-512 VNNI; AMX tiles
    where the CPU has them), ``"avx2"`` (AVX2 with FMA and F16C, no AVX-512 VNNI: ``csrc/gemm_avx2.cpp``, the same
    bits) or None. ``ATEN_CPU_CAPABILITY=avx2`` (how an AVX2-only CPU is approximated on a bigger one) picks avx2;
    ``default`` (no AVX2 at all) none."""
    import os

    from specdec.models.kernels.cpu import kernel_code

    if turned_off():
        return None
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if capability and capability != "avx2" and not capability.startswith("avx512"):
        return None
    return kernel_code(avx512=capability != "avx2")


def cpu_supported() -> bool:
    """Whether the extension's kernels run on this CPU (:func:`kernel_isa`: AVX-512 VNNI, or AVX2 with FMA and F16C)."""
    return kernel_isa() is not None


#: The flags the extension is built with (in its build key: :func:`specdec.models.kernels.build.build_key`).
CFLAGS, LDFLAGS = ("-O3", "-ffp-contract=off", "-fopenmp"), ("-fopenmp",)
#: ``SPECDEC_KERNELS=off``: act as on a CPU where no specdec kernel runs (what runs there: the README's "CPUs").
ENV_OFF = "SPECDEC_KERNELS"
#: What to install where the build fails.
FIX = "install a C++ compiler (g++ 9 or newer: apt install g++) and ninja (pip install ninja), then run again"

_warned = False


def turned_off() -> bool:
    """Whether ``SPECDEC_KERNELS=off`` (or 0, none) turns specdec's kernels off in this process."""
    import os

    return os.environ.get(ENV_OFF, "").strip().lower() in ("off", "0", "none", "false")


def loaded():
    """The compiled extension (built on the first use of the machine, then loaded from its folder:
    :mod:`specdec.models.kernels.build`)."""
    global _extension, _failure
    if _extension is not None:
        return _extension
    with _lock:
        if _extension is None:
            if _failure is not None:
                raise SpecDecError(_failure)
            isa = kernel_isa()
            if isa is None:
                _failure = ("specdec's CPU kernels are turned off (SPECDEC_KERNELS=off)" if turned_off() else
                            "specdec's CPU kernels need a CPU with AVX-512 VNNI or AVX2 (with FMA and F16C); "
                            "this one has neither")
                raise SpecDecError(_failure)
            from specdec.models.kernels import build

            try:
                _extension = build.load("specdec_cpu_kernels", SOURCES, HEADERS, CFLAGS, LDFLAGS)
            except Exception as exc:  # no compiler, no ninja, a compile error
                lines = str(exc).strip().splitlines()
                _failure = (f"could not build specdec's CPU kernels ({type(exc).__name__}: "
                            f"{lines[-1] if lines else exc}); {FIX}")
                raise SpecDecError(_failure) from None
            _extension.set_avx2(isa == "avx2")  # once per process: plain and speculative passes run the same code
    return _extension


def usable_isa() -> str | None:
    """The code that really runs here: :func:`kernel_isa` where the extension builds and loads (built on the first
    use of the machine), else None, after :func:`warn_unavailable` (the defaults then pick what runs without it)."""
    isa = kernel_isa()
    if isa is None:
        return None
    error = build_error()
    if error is not None:
        warn_unavailable(error)
        return None
    return isa


def warn_unavailable(error: str) -> None:
    """Warn once a process that the kernels cannot run (``error``: why, with the fix) and what runs instead."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"{error}. specdec runs without its CPU kernels: the default target in int8 through fbgemm "
                      "where torch has it, else in float, slower but exact with respect to what runs", stacklevel=3)


@contextlib.contextmanager
def avx2_code(on: bool = True) -> Iterator:
    """Inside the block the extension runs its AVX2 code (``on``) or its AVX-512 code, the process's choice restored
    after; yields the extension. For tests and measurements only: a process otherwise keeps one code for every pass."""
    ext = loaded()
    before = ext.uses_avx2()
    ext.set_avx2(on)
    try:
        yield ext
    finally:
        ext.set_avx2(before)


def amx_from() -> int:
    """The fewest rows a pass needs to run on AMX tiles (0: never; see :data:`AMX_FROM`)."""
    import os

    raw = os.environ.get("SPECDEC_INT8_AMX_FROM", "").strip()
    if not raw:
        return AMX_FROM
    if not raw.isdigit():
        raise SpecDecError(f"SPECDEC_INT8_AMX_FROM must be a row count (0: never use AMX), not {raw!r}")
    return int(raw)


def has_amx() -> bool:
    """Whether the kernel can use AMX tiles on this machine (the CPU has AMX-INT8 and Linux allows the tiles)."""
    return bool(loaded().has_amx())


def build_error() -> str | None:
    """Why the kernel cannot run here (None: it can; this builds it if it was not built yet)."""
    try:
        loaded()
    except SpecDecError as exc:
        return str(exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Build the extension now (``make setup`` calls this, so no first generation waits for the compiler). A failed
    build is said loudly; with ``--require`` (``make test``, CI) it is exit status 1, else 0 (the defaults then run
    without the kernels, and say so)."""
    import argparse

    parser = argparse.ArgumentParser(prog="specdec.models.kernels.extension.main", description=main.__doc__)
    parser.add_argument("--require", action="store_true", help="exit 1 where the kernels should run but do not build")
    args = parser.parse_args(argv)
    if not cpu_supported():
        print("specdec's CPU kernels: " + ("turned off (SPECDEC_KERNELS=off)" if turned_off() else
              "this CPU has neither AVX-512 VNNI nor AVX2 (the default target runs int8 through fbgemm, or float)"))
        return 0
    error = build_error()
    if error is None:
        print(f"specdec's CPU kernels: built and loaded ({kernel_isa()} code)")
        return 0
    banner = "!" * 100
    print(f"{banner}\nspecdec's CPU kernels FAILED to build: {error}\n"
          f"specdec still runs, slower: the default target in int8 through fbgemm or in float\n{banner}",
          file=sys.stderr)
    return 1 if args.require else 0


"""specdec's own int8 GEMM for CPUs with AVX-512 VNNI (``csrc/int8_vnni.cpp``; its row attention in
``csrc/row_attention.cpp``): the ``vnni`` int8 kernel. On a CPU with AVX2 but no AVX-512 VNNI the same functions run
their AVX2 code (``csrc/avx2_kernels.cpp``: exact integer sums, the same float operations lane for lane, so the same
bits; :func:`kernel_isa`).

fbgemm's int8 GEMM reads its weights once per few rows, so an 8-token verification pass of the int8 1.5B cost
1.5-1.7x a one-token step on the AMX Xeon; oneDNN's AMX GEMM is flat in the rows but streams its weights at
half fbgemm's rate in a pass (docs/int8_kernels.md). This kernel keeps up to 8 activation rows in registers
while it streams a weight once, with ``vpdpbusd`` (AVX-512 VNNI) for the int8 products: a pass of gamma + 1
tokens reads the weights once, as a one-token step does. Where the CPU has AMX, passes of :data:`AMX_FROM` rows or
more run on AMX tiles over the same layout (16 times the products per instruction, the same exact int32 sums, so the
same bits): an 8-token pass of the int8 1.5B costs 1.07x a one-token step on the AMX Xeon, and a prefill half.

Its bits are the oneDNN path's (:class:`specdec.models.int8_kernels.OnednnWeight`): each row quantized on its
own to round(x * (1 / max|x|) * 127), exact int32 accumulation, output scaled elementwise,
``(float(acc) * (w_scale / 127)) * row_scale + bias``. A row's output depends on its own input row only, so
the int8 model stays block-invariant (tests/test_quantize.py, tests/test_int8_vnni.py).

The extension is compiled on first use (about 40-80 s, once per machine, announced on stderr, with a progress line)
with the C++ compiler torch's extensions use, in a folder keyed by the content of its sources, its flags and torch's
version, then imported from there by every process, checkout and venv (:mod:`specdec.models.kernel_build`). Without
a compiler, on a CPU with neither AVX-512 VNNI nor AVX2, or with ``SPECDEC_KERNELS=off``, the kernel is unavailable:
:func:`usable_isa` says so once and the defaults run without it (:func:`specdec.config.default_target_quantize`;
:func:`specdec.models.int8_kernels.chosen` falls back to fbgemm).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator, Sequence

import torch

from specdec.errors import SpecDecError
from specdec.models.int8_weights import DeferredQWeight, is_per_channel

#: The extension's sources: the int8 GEMM (and the module's bindings), the int4 GEMM, the row attention, the decoder
#: step, their AVX2 code; and the headers they share (in the build's name hash, not compiled alone).
SOURCES = [Path(__file__).parent / "csrc" / name
           for name in ("int8_vnni.cpp", "int4_vnni.cpp", "row_attention.cpp", "decoder_step.cpp", "avx2_kernels.cpp",
                        "avx2_attention.cpp")]
HEADERS = [Path(__file__).parent / "csrc" / name for name in ("output_parts.h", "attention_pairs.h", "avx2_lanes.h")]
#: Output columns per packed group and input columns per 32-bit lane (the kernel's layout).
GROUP, LANE = 32, 4
QMAX = 127.0
#: Passes of at least this many rows run on AMX tiles where the CPU has them (the same bits: exact int32 sums);
#: ``SPECDEC_INT8_AMX_FROM`` overrides it (0: never).
AMX_FROM = 2

_lock = threading.Lock()
_extension = None
_failure: str | None = None


def kernel_isa() -> str | None:
    """The code the extension runs on this CPU (Linux: /proc/cpuinfo's flags): ``"avx512"`` (AVX-512 VNNI; AMX tiles
    where the CPU has them), ``"avx2"`` (AVX2 with FMA and F16C, no AVX-512 VNNI: ``csrc/avx2_kernels.cpp``, the same
    bits) or None. ``ATEN_CPU_CAPABILITY=avx2`` (how an AVX2-only CPU is approximated on a bigger one) picks avx2;
    ``default`` (no AVX2 at all) none."""
    import os

    from specdec.models.cpu import cpuinfo

    if turned_off():
        return None
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    flags = set(cpuinfo()[1])
    if capability and capability != "avx2" and not capability.startswith("avx512"):
        return None
    if capability != "avx2" and {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        return "avx512"
    return "avx2" if {"avx2", "fma", "f16c"} <= flags else None


def cpu_supported() -> bool:
    """Whether the extension's kernels run on this CPU (:func:`kernel_isa`: AVX-512 VNNI, or AVX2 with FMA and F16C)."""
    return kernel_isa() is not None


#: The flags the extension is built with (in its build key: :func:`specdec.models.kernel_build.build_key`).
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


def extension():
    """The compiled extension (built on the first use of the machine, then loaded from its folder:
    :mod:`specdec.models.kernel_build`)."""
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
            from specdec.models import kernel_build

            try:
                _extension = kernel_build.load("specdec_cpu_kernels", SOURCES, HEADERS, CFLAGS, LDFLAGS)
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
    ext = extension()
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
    return bool(extension().has_amx())


def build_error() -> str | None:
    """Why the kernel cannot run here (None: it can; this builds it if it was not built yet)."""
    try:
        extension()
    except SpecDecError as exc:
        return str(exc)
    return None


def pack(*parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N_i, K] parts (sibling weights, stacked in order) -> the kernel's layout [ceil(N / 32), ceil(K / 4), 32,
    4] (zero padding) and colsum128 [N] int32 (128 * each row's sum), read in one pass by the extension."""
    packed, colsum128 = extension().pack([p if p.stride(-1) == 1 else p.contiguous() for p in parts])
    return packed, colsum128


def unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of :func:`pack`: int8 [N, K]."""
    groups, lanes = packed.shape[0], packed.shape[1]
    return packed.permute(0, 2, 1, 3).reshape(groups * GROUP, lanes * LANE)[:n, :k].contiguous()


class VnniWeight:
    """A qint8 weight [out, in] (symmetric: zero points 0), packed for the vnni kernel with its scales.

    ``VnniWeight(qweight)``, or :meth:`from_parts` with the int8 values, scales and zero points as a stored model
    maps them (:class:`~specdec.models.int8_weights.DeferredQWeight`): then the packing is the only copy."""

    def __init__(self, qweight: torch.Tensor):
        per_channel = is_per_channel(qweight)
        zero_points = qweight.q_per_channel_zero_points() if per_channel else torch.tensor([qweight.q_zero_point()])
        scales = qweight.q_per_channel_scales() if per_channel else torch.tensor([qweight.q_scale()])
        self._init((qweight.int_repr(),), scales, zero_points, per_channel)

    @classmethod
    def from_parts(cls, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], per_channel: bool) -> "VnniWeight":
        """The weight of sibling parts [(int8 [out_i, in], scales, zero points)] stacked in order (a stored model's
        mapped values: read once, into the packed layout)."""
        weight = cls.__new__(cls)
        ints, scales, zero_points = zip(*parts)
        weight._init(ints, torch.cat(scales), torch.cat(zero_points), per_channel)
        return weight

    def _init(self, ints: tuple[torch.Tensor, ...], scales: torch.Tensor, zero_points: torch.Tensor,
              per_channel: bool) -> None:
        extension()  # fail here, at load time, not in the first forward pass
        self.out_features, self.in_features = sum(p.shape[0] for p in ints), ints[0].shape[1]
        self.per_channel = per_channel
        if bool(zero_points.ne(0).any()):
            raise SpecDecError("the vnni int8 kernel takes symmetric weights (zero points 0); use "
                               "SPECDEC_INT8_KERNEL=fbgemm for this model")
        self._scales64 = scales.to(torch.float64)  # as stored (the qint8 weight given back)
        # [N]: a quantized row's unit is 1 / QMAX (the oneDNN path's factor, computed the same way)
        self.scales_per_q = scales.to(torch.float32).expand(self.out_features).contiguous() / QMAX
        self.packed, self.colsum128 = pack(*ints)  # [N/32, K/4, 32, 4], [N]

    def qweight(self) -> torch.Tensor:
        """The qint8 weight [out, in] back."""
        ints = unpack(self.packed, self.out_features, self.in_features)
        zero_points = torch.zeros(self.out_features if self.per_channel else 1, dtype=torch.int64)
        return DeferredQWeight([(ints, self._scales64, zero_points)], self.per_channel).make()

    def rows(self, x2: torch.Tensor, per_pass: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x2 [M, K] float32 -> [M, N] float32, bias added. ``per_pass``: one activation scale for the whole pass
        (not block-invariant; for measurements)."""
        return self.row_parts(x2, (), per_pass, bias)[0]

    def row_parts(self, x2: torch.Tensor, widths: Sequence[int], per_pass: bool = False,
                  bias: torch.Tensor | None = None) -> list[torch.Tensor]:
        """:meth:`rows` written as one tensor per part of the columns: ``widths`` [w_i] (summing to N; each part
        but the last starting at a multiple of 32 columns) -> [[M, w_i]], each contiguous (a fused layer's
        siblings, with no slice copied after). Empty ``widths``: one part."""
        return extension().rows(x2.contiguous(), self.packed, self.colsum128, self.scales_per_q, bias,
                                self.out_features, per_pass, amx_from(), list(widths))


def main(argv: Sequence[str] | None = None) -> int:
    """Build the extension now (``make setup`` calls this, so no first generation waits for the compiler). A failed
    build is said loudly; with ``--require`` (``make test``, CI) it is exit status 1, else 0 (the defaults then run
    without the kernels, and say so)."""
    import argparse

    parser = argparse.ArgumentParser(prog="specdec.models.int8_vnni.main", description=main.__doc__)
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


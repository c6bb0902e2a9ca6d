"""The int8 matrix kernel under :class:`~specdec.models.quantized.int8_linear.Int8Linear`: one per process, chosen per CPU.

Both kernels take activation rows already divided by their largest absolute value (so every row spans
[-1, 1] whatever else shares the pass), multiply them by the int8 weight with exact int32 accumulation,
and scale each output element on its own. An output row therefore depends on its own input row only, bit
for bit, which is what makes the int8 target block-invariant (k one-token steps = one k-token pass).

- ``onednn``: oneDNN's prepacked int8 GEMM (``torch.ops.onednn.qlinear_prepack`` / ``qlinear_pointwise``,
  the kernel that Inductor's x86 int8 lowering calls). specdec quantizes each row itself, symmetric 8 bits:
  ``round(127 x / max|x|)``. oneDNN runs it on AMX tiles where the CPU has them; without AMX it may fall back to
  its reference matmul (``ref_matmul_int8``: on the AVX-512 EPYC, Zen 4, torch 2.13, 100-1,000x slower than
  ``specdec``, docs/int8_kernels.md), so no CPU kind defaults to it. No quantized tensors: it does not depend on
  torch's deprecated ``torch.ao`` quantized API.
- ``specdec``: specdec's own GEMM for AVX-512 VNNI CPUs, with AVX2 code of the same bits elsewhere
  (:mod:`specdec.models.kernels.extension`, compiled on first use):
  the oneDNN path's bits, with up to 8 rows computed per weight read, so a verification pass streams the
  weights once, as a one-token step does.
- ``fbgemm``: torch's dynamic int8 (``quantized.linear_dynamic``) with two pinned columns (+1, -1) that
  fix the quantization range of every row; 7-bit activations (``reduce_range``). Needs torch's
  quantized-tensor API (deprecated in torch 2.13, still present).

fbgemm computes other bits than the other two (7 against 8 bits per activation), so the choice is made once per process
(:func:`chosen`), before the first int8 layer is built, and never changes: plain and speculative decoding
of one process run the same kernel. ``SPECDEC_INT8_KERNEL=specdec|onednn|fbgemm`` overrides the choice; the default
is :func:`default_kernel`: ``specdec`` wherever specdec's kernel runs, else fbgemm (measured: docs/int8_kernels.md).
"""

from __future__ import annotations

import os
import warnings

import torch

from specdec.errors import SpecDecError

KERNELS = ("specdec", "onednn", "fbgemm")
#: Names the kernels had before (records and environments from before 2026-12-02 say "vnni" for specdec's).
OLD_NAMES = {"vnni": "specdec"}
ENV = "SPECDEC_INT8_KERNEL"
#: Where specdec's kernel does not run, fbgemm: it reads a weight once per few rows, but oneDNN's int8 GEMM without AMX
#: re-lays weights out or falls back to its reference matmul (100-1,000x slower); on the AMX Xeon oneDNN's AMX GEMM
#: is flat in the rows but 9% slower for one row, and whole one-token passes were slower with it
#: (docs/int8_kernels.md). Where fbgemm is missing (ARM builds of torch), oneDNN runs.
FALLBACK = "fbgemm"

_chosen: str | None = None


def available() -> list[str]:
    """The kernels this torch build and CPU can run exactly."""
    from specdec.models.kernels import extension
    from specdec.models.kernels.cpu import onednn_int8_exact

    out = ["specdec"] if extension.cpu_supported() else []
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise") and onednn_int8_exact():
        out.append("onednn")  # (not on an x86 CPU without VNNI or AMX: its int16 pair sums saturate there)
    if has_fbgemm():
        out.append("fbgemm")
    return out


def has_fbgemm() -> bool:
    """Whether this torch build has fbgemm's int8 kernels (x86 builds; not ARM's)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def default_kernel() -> str:
    """specdec's int8 kernel wherever it runs (AVX-512 VNNI, or its AVX2 code with the same bits:
    :func:`specdec.models.kernels.extension.kernel_isa`), so an int4-mixed model's int8 layers run the kernel its int4 layers
    run (one kernel a model: its row attention and decoder step); elsewhere :data:`FALLBACK`."""
    from specdec.models.kernels import extension

    return "specdec" if extension.kernel_isa() is not None else FALLBACK


def check_kernel(name: str) -> str:
    name = OLD_NAMES.get(name, name)
    if name not in KERNELS:
        raise SpecDecError(f"unknown int8 kernel {name!r} (from {ENV}); use one of: {', '.join(KERNELS)}")
    if name not in available():
        raise SpecDecError(f"the int8 kernel {name!r} is not available in this torch build or on this CPU "
                           f"(available: {', '.join(available()) or 'none'}); unset {ENV} to use the default")
    if name == "specdec":
        from specdec.models.kernels import extension

        error = extension.build_error()
        if error is not None:
            raise SpecDecError(f"{error}; or set {ENV}=fbgemm")
    return name


def chosen() -> str:
    """The process's int8 kernel: ``SPECDEC_INT8_KERNEL`` if set, else the CPU kind's default (the first
    available kernel where that one is not). Decided on the first call, then fixed."""
    global _chosen
    if _chosen is None:
        asked = os.environ.get(ENV, "").strip().lower()
        if asked:
            _chosen = check_kernel(asked)
        else:
            have = available()
            if not have:
                raise SpecDecError("this torch build has no int8 CPU kernel (neither oneDNN nor fbgemm); load the "
                                   "model without quantize=")
            from specdec.models.kernels import extension

            preferred, error = default_kernel(), None
            if preferred == "specdec" and "specdec" in have:
                error = extension.build_error()  # builds it on the machine's first use
                if error is not None:
                    have = [k for k in have if k != "specdec"]
                    if not have:
                        raise SpecDecError(error)
            # where the preferred kernel cannot run (no compiler, or ATEN_CPU_CAPABILITY=default on a CPU whose kind
            # has AVX-512 VNNI), fbgemm: oneDNN's int8 GEMM without AMX re-lays weights out and is several times slower
            _chosen = preferred if preferred in have else ("fbgemm" if "fbgemm" in have else have[0])
            if error is not None:
                extension.warn_unavailable(error)  # (once a process: "... int8 through fbgemm ...")
    return _chosen


def code_in_use() -> dict:
    """Which kernel code this process runs, for records (builds nothing): specdec's kernels' code (``"avx512"``,
    ``"avx2"``, or None where they are not loaded), whether passes of :func:`~specdec.models.kernels.extension.amx_from` rows or more use AMX tiles,
    the int8 kernel chosen (None before any int8 model), the ATen capability torch's own kernels use and the
    environment that set them (``ATEN_CPU_CAPABILITY``, ``SPECDEC_KERNELS``, ``SPECDEC_INT8_KERNEL``)."""
    from specdec.models.kernels import extension

    ext = extension._extension
    return {"specdec_kernels": None if ext is None else "avx2" if ext.uses_avx2() else "avx512",
            "amx_tiles": bool(ext is not None and not ext.uses_avx2() and ext.has_amx() and extension.amx_from() > 0),
            "int8_kernel": _chosen,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", extension.ENV_OFF, ENV,
                                               "SPECDEC_INT8_AMX_FROM") if k in os.environ}}


def describe_code(code: dict | None) -> str:
    """:func:`code_in_use` in words: "specdec kernels avx512 with AMX tiles, int8 kernel specdec, ATen AVX512"."""
    if not code:
        return "kernel code not recorded"
    ours = code.get("specdec_kernels")
    words = [f"specdec kernels {ours}" + (" with AMX tiles" if code.get("amx_tiles") else "") if ours
             else "specdec kernels not loaded", f"int8 kernel {code.get('int8_kernel') or 'none'}",
             f"ATen {code.get('aten_cpu_capability')}"]
    env = code.get("env") or {}
    return ", ".join(words) + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(env.items())) + ")" if env else "")


def use(name: str) -> None:
    """Fix the process's kernel to ``name`` (tests and measurements; before any int8 layer is built: layers
    already built keep the kernel they were packed for)."""
    global _chosen
    _chosen = check_kernel(name)


#: An activation row divided by its largest absolute value is quantized as round(QMAX * x): symmetric int8.
QMAX = 127.0


#: The smallest row scale (an all-zero row then stays zero instead of becoming NaN).
_TINY = torch.finfo(torch.float32).tiny


class OnednnWeight:
    """A qint8 weight [out, in] (symmetric: zero points 0), packed for oneDNN's int8 GEMM with its scales."""

    def __init__(self, qweight: torch.Tensor):
        self.out_features = qweight.shape[0]
        self.per_channel = qweight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)
        zero_points = qweight.q_per_channel_zero_points() if self.per_channel else torch.tensor([qweight.q_zero_point()])
        if bool(zero_points.ne(0).any()):
            raise SpecDecError("the oneDNN int8 kernel takes symmetric weights (zero points 0); use "
                               f"{ENV}=fbgemm for this model")
        scales = qweight.q_per_channel_scales() if self.per_channel else torch.tensor([qweight.q_scale()])
        self._scales64 = scales.to(torch.float64)  # as stored (the qint8 weight given back)
        # [N]: a quantized row's unit is 1 / QMAX
        self.scales_per_q = scales.to(torch.float32).expand(self.out_features).contiguous() / QMAX
        self._ones = torch.ones(self.out_features)
        self.zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        self.packed = torch.ops.onednn.qlinear_prepack(qweight.int_repr().contiguous(), None)  # [K, N] blocked

    def qweight(self) -> torch.Tensor:
        """The qint8 weight [out, in] back (oneDNN keeps its ints as [in, out] in a layout of its own)."""
        ints = self.packed.to_dense().t().contiguous()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
            if self.per_channel:
                return torch._make_per_channel_quantized_tensor(ints, self._scales64,
                                                                torch.zeros_like(self.zero_points), 0)
            return torch._make_per_tensor_quantized_tensor(ints, float(self._scales64[0]), 0)

    def rows(self, x2: torch.Tensor, per_pass: bool = False) -> torch.Tensor:
        """x2 [M, K] float32 -> [M, N] float32, without bias. Each row is divided by its largest absolute value
        and quantized to round(127 x): every element of a row's output is then a function of that row alone
        (exact int32 products, elementwise scales). ``per_pass``: one scale for the whole pass instead (not
        block-invariant; for measurements)."""
        if per_pass:
            scale = x2.abs().amax().clamp_min(_TINY).reshape(1, 1)  # [1, 1]
        else:
            scale = x2.abs().amax(dim=1, keepdim=True).clamp_min_(_TINY)  # [M, 1]
        xq = torch.round(x2 * (QMAX / scale)).to(torch.int8)  # [M, K], |values| <= 127
        # Unit scales: oneDNN only converts the int32 products to float32 (a rounding that depends on the
        # product alone); its own scaling epilogue differs with the number of rows in the last bit
        # (measured), so the scales are applied here, elementwise.
        y = torch.ops.onednn.qlinear_pointwise(xq, 1.0, 0, self.packed, self._ones, self.zero_points,
                                               None, 1.0, 0, torch.float32, "none", [], "")  # [M, N]
        y.mul_(self.scales_per_q)
        return y.mul_(scale)


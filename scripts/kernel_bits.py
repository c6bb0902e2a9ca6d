"""Two builds of specdec's CPU kernels on the same fixed inputs: the same bits, or where they differ.

A change to the C++ that should change nothing (a refactor, a shared header, new names) is checked against the build
before it: every build stays in its own folder under the kernel cache (specdec.models.kernels.build), so the old one
is still there.

    python scripts/kernel_bits.py OLD_BUILD_FOLDER NEW_BUILD_FOLDER   # e.g. ~/.cache/specdec/kernels/specdec_cpu_kernels_<key>

Each build runs in its own process (the two modules cannot share one); compared: the row attention (the one-row and
the grouped paths, bool / additive / no masks, D 24 to 256), the int8 GEMM (1 to 9 rows, AMX where the CPU has it)
and the int4 GEMM, each on its AVX-512 code (where the CPU has AVX-512 VNNI) and its AVX2 code. Prints one line per kind and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import tempfile

import torch


def load(folder: str):
    so = glob.glob(os.path.join(os.path.expanduser(folder), "*.so"))
    if not so:
        raise SystemExit(f"no built extension (.so) in {folder}")
    spec = importlib.util.spec_from_file_location(os.path.basename(so[0])[: -len(".so")], so[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs(ext) -> dict[str, torch.Tensor]:
    """The extension's results on inputs made from seed 0 (the same inputs for any build)."""
    from specdec.models.kernels.cpu import kernel_code

    g = torch.Generator().manual_seed(0)
    res = {}
    for avx2 in ((False, True) if kernel_code() == "avx512" else (True,)):  # (AVX-512 code where the CPU runs it)
        ext.set_avx2(avx2)
        isa = "avx2" if avx2 else "avx512"
        for D in (64, 128, 256, 80, 24):  # the grouped path (64 / 128 / 256), one row at a time (others)
            for B, H, Hkv, Q, L in ((1, 14, 2, 1, 37), (2, 12, 2, 5, 70), (1, 4, 4, 9, 200), (3, 8, 2, 3, 16)):
                q, k, v = (torch.randn(*shape, generator=g) for shape in ((B, H, Q, D), (B, Hkv, L, D), (B, Hkv, L, D)))
                ends = torch.randint(0, L + 1, (B, Q), generator=g)
                starts = torch.minimum(torch.randint(0, 4, (B, Q), generator=g), ends)
                for kind in ("none", "bool", "float"):
                    mask = (None if kind == "none" else torch.rand(B, Q, L, generator=g) > 0.2 if kind == "bool"
                            else torch.randn(B, Q, L, generator=g))
                    if kind == "float":
                        mask[..., ::7] = float("-inf")
                    res[f"attention {isa} D={D} B,H,Hkv,Q,L={B},{H},{Hkv},{Q},{L} mask={kind}"] = ext.row_attention(
                        q, k, v, starts, ends, mask, D ** -0.5)
        for N, K in ((96, 256), (200, 512)):
            ints = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
            packed, colsum128 = ext.pack([ints])
            scales = torch.rand(N, generator=g) / 127
            four = ext.layout4(*ext.quantize4(torch.randn(N, K, generator=g)))
            bias = torch.randn(N, generator=g)
            for M in (1, 2, 5, 9, 16, 33):
                x = torch.randn(M, K, generator=g)
                for amx in (0, 2):
                    res[f"int8 {isa} {M}x{K}x{N} amx_from={amx}"] = ext.rows(x, packed, colsum128, scales, bias, N, False,
                                                                            amx, [])[0]
                    res[f"int4 {isa} {M}x{K}x{N} amx_from={amx}"] = rows4(ext, x, four, bias, N, amx)
    return res


def rows4(ext, x, four, bias, N, amx):
    try:
        return ext.rows4(x, *four, bias, N, amx, [])[0]
    except TypeError:  # (a build from before rows4 took amx_from: it has no AMX path)
        return ext.rows4(x, *four, bias, N, [])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # (internal: write this build's outputs to --one's file)
    args = parser.parse_args()
    if args.one:
        torch.save(outputs(load(args.old)), args.one)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for folder in (args.old, args.new):
            files.append(os.path.join(tmp, f"{len(files)}.pt"))
            subprocess.run([sys.executable, __file__, folder, folder, "--one", files[-1]], check=True)
        old, new = (torch.load(f) for f in files)
    kinds: dict[str, list[int]] = {}
    for key in old:
        same = kinds.setdefault(" ".join(key.split()[:2]), [0, 0])
        same[0] += torch.equal(old[key], new[key])
        same[1] += 1
    for kind, (equal, total) in kinds.items():
        print(f"{kind:18} {equal}/{total} identical")
    return 0 if all(e == t for e, t in kinds.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

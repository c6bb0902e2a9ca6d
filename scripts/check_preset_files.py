"""Compare a format-2 preset cache with a format-1 one (float32 files, commit 27f66d2) on the real models.

    python scripts/check_preset_files.py OLD_CACHE NEW_CACHE

For each Qwen preset: the new bf16 file against the old float32 file cast to bf16 (tensor by tensor),
how many float32 values bfloat16 cannot hold, and the int8 draft loaded from the new int8 file against
the old float32 model quantized at load (int8 weights, scales, zero points, biases, logits).
"""

import pathlib
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))


def main(old_cache: str, new_cache: str) -> None:
    from transformers import AutoModelForCausalLM

    from specdec.models.quantized.quantize import quantize_hf

    from specdec.models.formats.stored import load_quantized
    from test_load_path import _assert_same_tensors

    for name in ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]:
        old_dir, new_dir = pathlib.Path(old_cache, "models", name), pathlib.Path(new_cache, "models", name)
        if (new_dir / "model.safetensors").is_file():
            with safe_open(str(new_dir / "model.safetensors"), "pt") as a, safe_open(str(old_dir / "model.safetensors"), "pt") as b:
                assert set(a.keys()) == set(b.keys())
                count = len(list(a.keys()))
                bad = [k for k in sorted(a.keys()) if not torch.equal(a.get_tensor(k), b.get_tensor(k).to(torch.bfloat16))]
                inexact = total = 0
                for k in b.keys():
                    t = b.get_tensor(k)
                    inexact += int((t != t.to(torch.bfloat16).float()).sum())
                    total += t.numel()
            print(f"{name}: {count} tensors, bf16 bit-identical: {not bad} {bad[:3]}; "
                  f"float32 values bf16 cannot hold: {inexact}/{total} = {inexact / total:.3f}", flush=True)
        if (new_dir / "model.int8.safetensors").is_file():
            new = load_quantized(new_dir, new_dir / "model.int8.safetensors", "int8")
            old = AutoModelForCausalLM.from_pretrained(old_dir, dtype=torch.float32).eval()
            quantize_hf(old, "int8")
            _assert_same_tensors(new, old)
            ids = torch.tensor([[755, 15801, 1445, 982, 262]])
            with torch.no_grad():
                same = torch.equal(new(ids).logits, old(ids).logits)
            print(f"{name}: int8 tensors identical; logits identical: {same}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])

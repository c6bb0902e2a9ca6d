"""Speculative beam search measured for ``specdec results``: plain beam search vs exact speculative
beam search (paper Appendix A.4) vs the report's approximate mode, per beam width, on the same prompts.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from specdec.sweeps.pool import ModelPool
from specdec.analysis.values import MISSING, fmt
from specdec.tasks.metrics import score
from specdec.publish.tables import quality_text
from specdec.publish.plan import Step
from specdec.tasks import encode_item, load_task

#: Tokens of the untimed warmup call of each mode.
WARMUP_TOKENS = 8


def run_beam(step: Step, target: Any, pool: ModelPool, progress: bool = True) -> dict[str, Any]:
    """Plain beam search vs exact speculative (Appendix A.4) vs the report's mode, per width; same prompts,
    rotating order. Speedup = plain seconds / mode seconds over all prompts."""
    from specdec.beam import beam_search as fn

    o = step.options
    task = load_task(o["task"], o["n_prompts"])
    prompts = [encode_item(target, item) for item in task.items]
    draft = pool.get(o["draft"])
    rows = []
    for w in o["widths"]:
        configs = {
            "plain": {},
            "exact": {"draft": draft, "draft_beams": w, "gamma": o["gamma"], "mode": "exact"},
            "report": {"draft": draft, "gamma": o["gamma"], "mode": "report"},
        }
        results: dict[str, list[Any]] = {k: [] for k in configs}
        errors: dict[str, str] = {}
        names = list(configs)
        for name, kw in configs.items():  # warm up: untimed, few tokens
            try:
                fn(target, prompts[0], num_beams=w, max_new_tokens=min(WARMUP_TOKENS, o["max_new_tokens"]), seed=o["seed"], **kw)
            except Exception as err:
                errors[name] = f"{type(err).__name__}: {err}"
        for i, ids in enumerate(prompts):
            order = names[i % len(names):] + names[: i % len(names)]
            for name in order:
                if name in errors:
                    continue
                if progress:
                    print(f"beam {task.name} w={w} {name} prompt {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
                try:
                    t0 = time.perf_counter()
                    out = fn(target, ids, num_beams=w, max_new_tokens=o["max_new_tokens"], seed=o["seed"], **configs[name])
                    results[name].append((out, time.perf_counter() - t0))
                except Exception as err:
                    errors[name] = f"{type(err).__name__}: {err}"
        plain_seconds = sum(s for _, s in results["plain"]) if "plain" not in errors else None
        for name in names:
            if name in errors:
                rows.append({"task": task.name, "num_beams": w, "mode": name, "error": errors[name]})
                continue
            outs = [r for r, _ in results[name]]
            seconds = sum(s for _, s in results[name])
            texts = [task.clean(target.decode(r.token_ids)) for r in outs]
            quality = score(task.metrics, texts, task.references) if task.metrics and task.has_references else None
            same = None
            if name != "plain" and "plain" not in errors:
                same = sum(a.token_ids == b.token_ids for (a, _), (b, _) in zip(results[name], results["plain"]))
            stats = [r.stats for r in outs]
            calls = sum(s.get("target_calls", 0) for s in stats)
            drafted = sum((s.get("drafted_steps") or s.get("drafted_tokens") or 0) for s in stats)
            accepted = sum((s.get("accepted_steps") or s.get("accepted_tokens") or 0) for s in stats)
            rows.append({
                "task": task.name, "num_beams": w, "mode": name,
                "exact": all(s.get("exact", True) for s in stats),
                "draft_beams": w if name == "exact" else None,
                "seconds": seconds, "new_tokens": sum(len(r.token_ids) for r in outs),
                "speedup_vs_plain_beam": plain_seconds / seconds if plain_seconds and seconds else None,
                "quality": quality, "identical_to_plain_beam": None if same is None else f"{same}/{len(outs)}",
                "target_calls": calls, "acceptance_rate": accepted / drafted if drafted else None,
            })
    return {"options": {**o, "draft": draft.name}, "task_source": task.source, "quality_note": task.metric_note,
            "rows": rows}


def beam_markdown(result: dict[str, Any]) -> str:
    if "skipped" in result:  # a record from before specdec.beam existed (read back by --resume)
        return f"Skipped: {result['skipped']}."
    lines = ["| task | beams w | mode | exact | seconds | speedup vs plain beam | quality | tokens == plain beam | "
             "target calls | acceptance |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['task']} | {r['num_beams']} | {r['mode']} | " + f"{MISSING} | " * 6 + f"error: {r['error']} |")
            continue
        up = r["speedup_vs_plain_beam"]
        lines.append(f"| {r['task']} | {r['num_beams']} | {r['mode']} | {'yes' if r['exact'] else 'NO (approximate)'} | "
                     f"{r['seconds']:.1f} | {MISSING if up is None else f'{up:.2f}x'} | {quality_text(r['quality'])} | "
                     f"{r['identical_to_plain_beam'] or MISSING} | {r['target_calls']} | {fmt(r['acceptance_rate'], '.2f')} |")
    o = result["options"]
    lines += ["", f"{o['n_prompts']} prompts ({result['task_source']}), at most {o['max_new_tokens']} new tokens; draft "
              f"{o['draft']}, gamma {o['gamma']}; exact mode with draft beams u = w. Quality: {result['quality_note']}. "
              "Acceptance: accepted / drafted beam steps (exact) or tokens (report)."]
    return "\n".join(lines)

"""``specdec results``: regenerate ``docs/RESULTS.md``: every table, the command behind it, the machine,
and the figures, from one run.

    specdec results --quick                 # checks the pipeline: a few minutes on a 2-core CPU
    specdec results                         # the published set: about an hour
    python scripts/make_results.py --quick  # the same command
    specdec results --dry-run               # print the plan (the equivalent commands) and stop

The plan (see QUICK and FULL below; --n-prompts / --max-new-tokens / --tasks override it):

1. alpha (paper Tables 3 and 5): for each task, the draft model, the draft int8-quantized, unigram,
   bigram, prompt lookup and random, at temperatures 0 and 1, with lenience 1, 0.5, 0.3, 0.1;
2. speed (paper Tables 2 and 4): for each task, plain vs speculative decoding at several gammas and
   temperatures 0 and 1, the Theorem 8 prediction from the measured alpha and c beside each measured
   speedup, quality, and transformers' generate and assisted generation as peers;
3. adaptive and hierarchical drafting (issue 5): on the code task at temperature 0, fixed gammas vs
   every gamma schedule vs the hierarchy [draft <- prompt-lookup] (and lenience in the full plan),
   with the comparison of the best fixed gamma to the best adaptive or hierarchical setting;
4. speculative beam search (issue 6), when ``specdec.beam.beam_search`` is available: plain, exact
   (Appendix A.4) and the report's approximate mode, walltime and quality;
5. the figures (``specdec plot``).

Every speedup's +-15% check against Theorem 8 is printed, and where one fails, the measured split
that explains the gap (:mod:`specdec.bench.theory`). Output: ``OUT/RESULTS.md``, ``OUT/figures/*.png``
and ``OUT/results/*`` (the raw JSON, CSV and markdown of every step).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from specdec.bench import alpha as alpha_module
from specdec.bench.drafts import ModelPool
from specdec.bench.metrics import score
from specdec.bench.report import grid_markdown, machine_info, quality_text
from specdec.bench.tasks import encode_item, load_task
from specdec.errors import SpecDecError

TASKS = ("humaneval", "translation", "summarization")

# n prompts, max new tokens, gammas, drafts ("{d}" is the draft model) per task; "*" for other tasks.
# QUICK checks the whole pipeline in a few minutes (numbers from 1 prompt are indicative only); FULL is
# the published run (about 50-60 minutes on 2 cores), sized to cover every table issues 3, 5 and 6 ask for.
QUICK: dict[str, Any] = {
    "alpha": {"n_prompts": 1, "max_new_tokens": 16},
    "speed": {
        "humaneval": (1, 16, "4", ["{d}"]),
        "translation": (1, 16, "4", ["{d}"]),
        "summarization": (1, 16, "4", ["{d}"]),
        "*": (1, 16, "4", ["{d}"]),
    },
    "extension": {"n_prompts": 1, "max_new_tokens": 16, "gammas": "4", "schedules": "constant,adaptive",
                  "drafts": ["{d}", "{d}<-prompt-lookup"], "leniences": "1"},
    "beam": {"tasks": ["translation"], "n_prompts": 1, "max_new_tokens": 12, "widths": [3]},
}
FULL: dict[str, Any] = {
    "alpha": {"n_prompts": 3, "max_new_tokens": 40},
    "speed": {
        "humaneval": (3, 48, "2,4,6", ["{d}", "{d}:int8"]),
        "translation": (3, 48, "2,4", ["{d}", "prompt-lookup"]),
        "summarization": (2, 48, "4", ["{d}", "prompt-lookup"]),
        "*": (3, 48, "2,4,6", ["{d}"]),
    },
    "extension": {"n_prompts": 3, "max_new_tokens": 48, "gammas": "2,4,6",
                  "schedules": "constant,heuristic,adaptive,confidence",
                  "drafts": ["{d}", "{d}<-prompt-lookup", "{d}<-{d}:int8"], "leniences": "1,0.5"},
    # summarization prompts are long (a man page each): one prompt keeps widths 3 and 5 within the hour
    "beam": {"tasks": ["translation", "summarization"], "n_prompts": 2, "max_new_tokens": 32, "widths": [3, 5],
             "per_task": {"summarization": {"n_prompts": 1}}},
}
PARTS = ("alpha", "speed", "extension", "beam")


@dataclass
class Step:
    kind: str  # alpha | speed | extension | beam
    name: str  # file stem under OUT/results
    title: str
    argv: list[str] = field(default_factory=list)  # alpha / bench: arguments after the subcommand
    options: dict[str, Any] = field(default_factory=dict)  # beam

    def record(self) -> dict[str, Any]:
        """What identifies the step's measurement (stored with its output; --resume compares it)."""
        return {"kind": self.kind, "argv": list(self.argv), "options": dict(self.options)}

    def output(self, out: Path) -> Path:
        """The JSON file the step writes."""
        if self.kind in ("speed", "extension"):
            return out / "results" / self.name / "bench.json"
        return out / "results" / f"{self.name}.json"

    def command(self, out: Path) -> str:
        if self.kind == "beam":
            return "(part of specdec results; no separate command)"
        sub = "alpha" if self.kind == "alpha" else "bench"
        extra = ["--json", str(out / "results" / f"{self.name}.json")] if sub == "alpha" else \
            ["--out", str(out / "results" / self.name)]
        return "specdec " + sub + " " + " ".join(shlex.quote(a) for a in self.argv + extra)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="the small plan: every step on 1 prompt (a few minutes on 2 cores)")
    parser.add_argument("--out", default="docs", metavar="DIR", help="writes DIR/RESULTS.md, DIR/figures, DIR/results")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model (same tokenizer as the target)")
    parser.add_argument("--dtype", default="bf16", help="bf16 (fast on CPU), fp32 or fp16")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma list of tasks (see specdec bench --task)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list out of {', '.join(PARTS)}")
    parser.add_argument("--n-prompts", type=int, default=None, help="override the plan's prompts per step")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override the plan's tokens per prompt")
    parser.add_argument("--no-int8-draft", action="store_true", help="leave the int8-quantized draft out")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: leave as is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true",
                        help="reuse every step whose output is already in DIR/results (from an interrupted or earlier "
                             "run with the same plan); a step whose recorded settings differ is measured again")
    parser.add_argument("--dry-run", action="store_true", help="print the plan's commands and stop")


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def plan(args: argparse.Namespace) -> list[Step]:
    """The steps of a results run, each with the arguments of its ``specdec alpha`` / ``bench`` command."""
    p = QUICK if args.quick else FULL
    d = args.draft
    tasks = _list(args.tasks)
    parts = _list(args.parts)
    bad = [x for x in parts if x not in PARTS]
    if bad or not tasks:
        raise SpecDecError(f"unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}" if bad else "no tasks given")

    def n(value: int) -> str:
        return str(args.n_prompts or value)

    def tokens(value: int) -> str:
        return str(args.max_new_tokens or value)

    def drafts(specs: Sequence[str]) -> list[str]:
        out = [s.replace("{d}", d) for s in specs]
        return [s for s in out if not (args.no_int8_draft and ":int8" in s)]

    common = ["--target", args.target, "--dtype", args.dtype, "--seed", str(args.seed)]
    steps: list[Step] = []
    if "alpha" in parts:
        alpha_drafts = drafts(["{d}", "{d}:int8", "unigram", "bigram", "prompt-lookup", "random"])
        for task in tasks:
            steps.append(Step("alpha", f"alpha_{_slug(task)}", f"alpha, {task}", [
                *common, "--task", task, "--n-prompts", n(p["alpha"]["n_prompts"]),
                "--max-new-tokens", tokens(p["alpha"]["max_new_tokens"]), "--temperatures", "0,1",
                "--leniences", "1,0.5,0.3,0.1", "--drafts", *alpha_drafts]))
    if "speed" in parts:
        for task in tasks:
            count, length, gammas, specs = p["speed"].get(task, p["speed"]["*"])
            primary_gamma = gammas.split(",")[-1] if "4" not in gammas.split(",") else "4"
            steps.append(Step("speed", f"speed_{_slug(task)}", f"speed, {task}", [
                *common, "--task", task, "--n-prompts", n(count), "--max-new-tokens", tokens(length),
                "--temperatures", "0,1", "--gammas", gammas, "--gamma", primary_gamma,
                "--methods", "specdec-plain,specdec-spec,hf-plain,hf-assisted", "--drafts", *drafts(specs)]))
    code_task = "humaneval" if "humaneval" in tasks else tasks[0]
    if "extension" in parts:
        e = p["extension"]
        steps.append(Step("extension", f"extension_{_slug(code_task)}",
                          f"fixed gamma vs schedules vs hierarchies, {code_task}", [
                              *common, "--task", code_task, "--n-prompts", n(e["n_prompts"]),
                              "--max-new-tokens", tokens(e["max_new_tokens"]), "--temperatures", "0",
                              "--gammas", e["gammas"], "--gamma", "4", "--gamma-schedules", e["schedules"],
                              "--leniences", e["leniences"], "--methods", "specdec-plain,specdec-spec",
                              "--drafts", *drafts(e["drafts"])]))
    if "beam" in parts:
        b = p["beam"]
        beam_tasks = [t for t in b["tasks"] if t in tasks] or [t for t in tasks if t != code_task][:1] or tasks[:1]
        for task in beam_tasks:
            own = b.get("per_task", {}).get(task, {})
            steps.append(Step("beam", f"beam_{_slug(task)}", f"speculative beam search, {task}", options={
                "task": task, "n_prompts": args.n_prompts or own.get("n_prompts", b["n_prompts"]),
                "max_new_tokens": args.max_new_tokens or own.get("max_new_tokens", b["max_new_tokens"]),
                "widths": b["widths"], "draft": d, "gamma": 3, "seed": args.seed}))
    return steps


def _slug(task: str) -> str:
    """A file-name stem for a task: its name, or KIND_FILENAME for a task read from a file."""
    kind, sep, rest = task.partition(":")
    text = f"{kind}_{Path(rest.split(',')[0]).name}" if sep else task
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def _parse(module: Any, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specdec")
    module.add_arguments(parser)
    return parser.parse_args(argv)


# -- issue 6: speculative beam search -------------------------------------------------------------------

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
                fn(target, prompts[0], num_beams=w, max_new_tokens=min(8, o["max_new_tokens"]), seed=o["seed"], **kw)
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
            lines.append(f"| {r['task']} | {r['num_beams']} | {r['mode']} | – | – | – | – | – | – | error: {r['error']} |")
            continue
        up = r["speedup_vs_plain_beam"]
        acc = r["acceptance_rate"]
        lines.append(f"| {r['task']} | {r['num_beams']} | {r['mode']} | {'yes' if r['exact'] else 'NO (approximate)'} | "
                     f"{r['seconds']:.1f} | {'–' if up is None else f'{up:.2f}x'} | {quality_text(r['quality'])} | "
                     f"{r['identical_to_plain_beam'] or '–'} | {r['target_calls']} | {'–' if acc is None else f'{acc:.2f}'} |")
    o = result["options"]
    lines += ["", f"{o['n_prompts']} prompts ({result['task_source']}), at most {o['max_new_tokens']} new tokens; draft "
              f"{o['draft']}, gamma {o['gamma']}; exact mode with draft beams u = w. Quality: {result['quality_note']}. "
              "Acceptance: accepted / drafted beam steps (exact) or tokens (report)."]
    return "\n".join(lines)


# -- issue 5: the comparison it asks for -------------------------------------------------------------------

def extension_summary(result: dict[str, Any]) -> str:
    """Best fixed gamma vs best adaptive-or-hierarchical setting (exact, temperature 0), against the issue's +15%."""
    rows = [r for r in result["rows"] if r["method"] == "specdec-spec" and r.get("lenience") == 1.0
            and r.get("speedup_vs_specdec_plain") is not None]
    fixed = [r for r in rows if r["schedule"] == "constant" and "<-" not in (r["draft"] or "")]
    other = [r for r in rows if r["schedule"] != "constant" or "<-" in (r["draft"] or "")]
    if not fixed or not other:
        return "Not enough configurations to compare fixed gamma with adaptive or hierarchical drafting."
    best_fixed = max(fixed, key=lambda r: r["speedup_vs_specdec_plain"])
    best_other = max(other, key=lambda r: r["speedup_vs_specdec_plain"])
    gain = best_other["speedup_vs_specdec_plain"] / best_fixed["speedup_vs_specdec_plain"] - 1.0
    verdict = "met" if gain >= 0.15 else "NOT met"
    text = (f"Best fixed gamma: {best_fixed['label']} at {best_fixed['speedup_vs_specdec_plain']:.2f}x; best adaptive or "
            f"hierarchical setting: {best_other['label']} at {best_other['speedup_vs_specdec_plain']:.2f}x: "
            f"{gain:+.0%} (issue 5 target: at least +15%, {verdict}).")
    if gain < 0.15:
        text += (" Why, measured: the Theorem 8 checks above give each setting's alpha, c and time split, and the "
                 "hierarchy rows give alpha, calls and time per level.")
    return text


# -- the run --------------------------------------------------------------------------------------------

def _command(args: argparse.Namespace) -> str:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([])
    parts = ["specdec results"]
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "dry_run", "resume"):
            continue
        value = getattr(args, action.dest, None)
        if value == getattr(defaults, action.dest):
            continue
        flag = action.option_strings[0]
        parts.append(flag if isinstance(value, bool) else f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


def generate(args: argparse.Namespace, *, pool: ModelPool | None = None, target: Any = None,
             progress: bool = True) -> dict[str, Any]:
    """Run the plan, write OUT/RESULTS.md, OUT/figures and OUT/results; returns what was measured.

    pool / target: models already loaded (tests inject tiny ones)."""
    from specdec import bench
    from specdec.bench import plot

    out = Path(args.out).expanduser()
    steps = plan(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    pool = pool if pool is not None else ModelPool(args.dtype)
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    loaded = target

    def get_target() -> Any:  # loaded on the first step that measures (a fully resumed run loads nothing)
        nonlocal loaded
        if loaded is None:
            loaded = pool.get(args.target)
        return loaded

    done: list[tuple[Step, dict[str, Any]]] = []
    reused: list[str] = []
    for index, step in enumerate(steps, 1):
        previous = _previous(step, out) if getattr(args, "resume", False) else None
        if previous is not None:
            if progress:
                print(f"[{index}/{len(steps)}] {step.title}: reusing {step.output(out)}", file=sys.stderr, flush=True)
            done.append((step, previous))
            reused.append(step.name)
            continue
        if progress:
            print(f"[{index}/{len(steps)}] {step.title}: {step.command(out)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        if step.kind == "alpha":
            document = alpha_module.run(_parse(alpha_module, step.argv), target=get_target(), pool=pool,
                                        progress=progress)
        elif step.kind in ("speed", "extension"):
            document = bench.run(_parse(bench, step.argv), target=get_target(), pool=pool, progress=progress)
        else:
            document = run_beam(step, get_target(), pool, progress)
        document["step_seconds"] = time.perf_counter() - t0
        document["results_step"] = step.record()
        document["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        if step.kind in ("speed", "extension"):
            bench.write_outputs(document, step.output(out).parent)
        else:
            step.output(out).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        done.append((step, document))
    figures = plot.write_all(out / "figures", [doc for step, doc in done if step.kind == "speed"])
    for step, doc in done:
        if step.kind == "extension":
            figures += plot.bench_figures(doc, out / "figures", f"speedup_vs_gamma_{step.name}")
    summary = {
        "command": _command(args),
        "mode": "quick" if args.quick else "full",
        "minutes": (time.perf_counter() - t_start) / 60,
        # None when a reused step's output predates the recorded step time
        "measured_minutes": (sum(doc["step_seconds"] for _, doc in done) / 60
                             if all("step_seconds" in doc for _, doc in done) else None),
        "machine": {**machine_info(_dtype_name(loaded, args.dtype)), "load_average_before": load_before,
                    "load_average_after": os.getloadavg()[0] if load_before is not None else None},
        "target": loaded.name if loaded is not None else args.target,
        "draft": args.draft,
        "reused": reused,
    }
    text = results_markdown(summary, done, figures, out)
    (out / "RESULTS.md").write_text(text, encoding="utf-8")
    return {"summary": summary, "steps": [(s.name, d) for s, d in done], "figures": [str(f) for f in figures],
            "markdown": text}


def _dtype_name(model: Any, dtype: str) -> str:
    if model is not None:
        return str(model.dtype).replace("torch.", "")
    from specdec.models import parse_dtype

    return str(parse_dtype(dtype)).replace("torch.", "")


def _previous(step: Step, out: Path) -> dict[str, Any] | None:
    """The step's output from an earlier run, when it exists and was made with the same settings (outputs
    written before settings were recorded are taken as they are)."""
    path = step.output(out)
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    recorded = document.get("results_step")
    return document if recorded is None or recorded == json.loads(json.dumps(step.record())) else None


def _theorem8_checks(done: list[tuple[Step, dict[str, Any]]]) -> tuple[int, int, list[str]]:
    within = total = 0
    lines = []
    for step, doc in done:
        if step.kind not in ("speed", "extension"):
            continue
        for r in doc["rows"]:
            if r["method"] != "specdec-spec" or r.get("within_15pct") is None:
                continue
            total += 1
            within += bool(r["within_15pct"])
            lines.append(f"- {r['task']}, {r['label']}, temperature {r['temperature']:g}: {r['check']}")
    return within, total, lines


def results_markdown(summary: dict[str, Any], done: list[tuple[Step, dict[str, Any]]], figures: list[Path],
                     out: Path) -> str:
    m = summary["machine"]
    lines = [
        "# specdec results",
        "",
        f"Generated by `{summary['command']}` ({summary['mode']} mode"
        + (f", {summary['measured_minutes']:.0f} min of measurement" if summary.get("measured_minutes") else "")
        + "). Every table "
        "and figure below comes from that one run; rerun the command to regenerate this file. Raw data of each "
        "step (JSON, CSV, markdown): `results/`. Each step also names the `specdec alpha` / `specdec bench` "
        "command that measures the same thing on its own.",
        "",
        *([f"The command ran with `--resume`: steps {', '.join(summary['reused'])} were reused from an earlier run of "
           "the same plan on the same machine (their outputs in `results/`, each with its measurement time).", ""]
          if summary.get("reused") else []),
        "## Machine",
        "",
        "| CPU | cores | torch threads | torch | transformers | python | dtype | date (UTC) | load average before / after |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {m['cpu']} | {m['cpu_count']} | {m['torch_threads']} | {m['torch']} | {m['transformers']} | {m['python']} | "
        f"{m['dtype']} | {m['date']} | {_f(m.get('load_average_before'))} / {_f(m.get('load_average_after'))} |",
        "",
        f"Target {summary['target']}, draft {summary['draft']}. Timings are wall-clock on a shared 2-core machine: a "
        "1-minute load average well above the torch thread count, or a CPU utilization well below it in the "
        "tables, means other work shared the CPU during the run."
        + (" With reused steps, the date and load average in this table are from when this file was written; each "
           "step's own measurement date is in its raw JSON (`machine`), and each speed table prints its load average."
           if summary.get("reused") else ""),
    ]
    within, total, checks = _theorem8_checks(done)
    lines += ["", "## Summary", ""]
    if total:
        lines.append(f"- Theorem 8: {within} of {total} measured speedups are within ±15% of the prediction from "
                     "the measured alpha and c (details and the measured explanation of every gap in section 6).")
    for step, doc in done:
        if step.kind == "extension":
            lines.append(f"- Issue 5 ({step.title}): {extension_summary(doc)}")
    same = [(r["identical_to_plain"], r["label"], r["task"]) for step, doc in done if step.kind in ("speed", "extension")
            for r in doc["rows"] if r["method"] == "specdec-spec" and r.get("exact") and r.get("identical_to_plain")]
    if same:
        equal = sum(int(s.split("/")[0]) for s, _, _ in same)
        runs = sum(int(s.split("/")[1]) for s, _, _ in same)
        lines.append(f"- Exactness at temperature 0: {equal} of {runs} speculative runs produced exactly the tokens "
                     f"of plain decoding (in {summary['machine']['dtype']}; bf16 rounding can flip a near-tie between "
                     "a 1-token and a (gamma+1)-token forward pass, which is why the exactness tests run in fp32).")

    lines += ["", "## 1. Acceptance rate alpha (paper Table 3; lenience: Table 5)", ""]
    for step, doc in done:
        if step.kind == "alpha":
            lines += [f"### {doc['config']['task']}", "", f"`{step.command(out)}`", "", alpha_module.table(doc), ""]
    lines += ["## 2. Speed and the Theorem 8 prediction (paper Tables 2 and 4)", ""]
    for step, doc in done:
        if step.kind == "speed":
            lines += [f"### {doc['config']['task']}", "", f"`{step.command(out)}`", "", grid_markdown(doc), ""]
    lines += ["## 3. Fixed gamma vs gamma schedules vs hierarchical drafting (issue 5)", ""]
    for step, doc in done:
        if step.kind == "extension":
            lines += [f"### {doc['config']['task']}", "", f"`{step.command(out)}`", "", extension_summary(doc), "",
                      grid_markdown(doc), ""]
    lines += ["## 4. Speculative beam search (issue 6)", ""]
    beams = [(s, d) for s, d in done if s.kind == "beam"]
    if not beams:
        lines.append("Not run (--parts).")
    for step, doc in beams:
        rows = doc.get("rows") or [{}]
        lines += [f"### {rows[0].get('task', step.options['task'])}", "", beam_markdown(doc), ""]
    lines += ["", "## 5. Figures", ""]
    for path in figures:
        rel = os.path.relpath(path, out)
        lines += [f"![{Path(path).stem}]({rel})", ""]
    from specdec.bench.plot import table1_markdown

    lines += ["Closed forms behind Figures 2-4 (`specdec plot`); the paper's Table 1 (c = c_hat = 0), computed:", "",
              table1_markdown(), ""]
    lines += ["## 6. Theorem 8 checks (±15%)", ""]
    lines += checks or ["No speculative configuration with a prediction."]
    return "\n".join(lines) + "\n"


def _f(x: Any) -> str:
    return "–" if x is None else f"{x:.2f}"


def main(args: argparse.Namespace) -> int:
    if args.dry_run:
        out = Path(args.out).expanduser()
        for step in plan(args):
            print(f"# {step.title}\n{step.command(out) if step.kind != 'beam' else json.dumps(step.options)}")
        return 0
    result = generate(args)
    print(result["markdown"])
    print(f"wrote {Path(args.out) / 'RESULTS.md'} and {len(result['figures'])} figures", file=sys.stderr)
    return 0

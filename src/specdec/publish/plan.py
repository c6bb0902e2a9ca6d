"""The plan of ``specdec results``: which steps it runs, each with the equivalent ``specdec alpha`` /
``specdec bench`` command.

:data:`QUICK` checks the whole pipeline on one prompt per step; :data:`FULL` is the published run, sized
to cover every table of docs/RESULTS.md. ``--n-prompts`` / ``--max-new-tokens`` / ``--tasks`` override
them.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from specdec.bench.arguments import DEFAULT_GAMMA
from specdec.sweeps.options import DEFAULT_DRAFT, DEFAULT_TARGET, add_dtype_argument, add_threads_argument, comma_list
from specdec.errors import SpecDecError

TASKS = ("humaneval", "translation", "summarization")
PARTS = ("alpha", "speed", "extension", "beam")
TEMPERATURES = "0,1"
ALPHA_LENIENCES = "1,0.5,0.3,0.1"  # paper Table 5's form
ALPHA_DRAFTS = ("{d}", "{d}:int8", "unigram", "bigram", "prompt-lookup", "random")
SPEED_METHODS = "specdec-plain,specdec-spec,hf-plain,hf-assisted"
EXTENSION_METHODS = "specdec-plain,specdec-spec"
EXTENSION_TEMPERATURES = "0"  # greedy: every setting's tokens are checked against plain decoding
BEAM_GAMMA = 3

# n prompts, max new tokens, gammas, drafts ("{d}" is the draft model) per task; "*" for other tasks.
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
    # a standard error of alpha <= 0.02 needs about 600 positions (0.5 / sqrt(600) = 0.02): 20 prompts x 40 tokens,
    # 50 for translation (its German sentences end after about 14 tokens)
    "alpha": {"n_prompts": 20, "max_new_tokens": 40, "per_task": {"translation": 50}},
    # Theorem 8 vs measured on 20 prompts per cell (issue 28): about 2 h on 2 cores, best run one prompt per
    # unit (--shard-size 1 --records DIR) so that an interrupted run resumes
    "speed": {
        "humaneval": (20, 48, "2,4,6", ["{d}", "{d}:int8"]),
        "translation": (20, 48, "2,4", ["{d}", "prompt-lookup"]),
        "summarization": (20, 48, "4", ["{d}", "prompt-lookup"]),
        "*": (20, 48, "2,4,6", ["{d}"]),
    },
    "extension": {"n_prompts": 3, "max_new_tokens": 48, "gammas": "2,4,6",
                  "schedules": "constant,heuristic,adaptive,confidence",
                  "drafts": ["{d}", "{d}<-prompt-lookup", "{d}<-{d}:int8"], "leniences": "1,0.5"},
    # summarization prompts are long (a man page each): one prompt each keeps the beam widths affordable
    "beam": {"tasks": ["translation", "summarization"], "n_prompts": 2, "max_new_tokens": 32, "widths": [3, 5],
             "per_task": {"summarization": {"n_prompts": 1}}},
}


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
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target model")
    parser.add_argument("--draft", default=DEFAULT_DRAFT, help="draft model (same tokenizer as the target)")
    add_dtype_argument(parser)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma list of tasks (see specdec bench --task)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list out of {', '.join(PARTS)}")
    parser.add_argument("--n-prompts", type=int, default=None, help="override the plan's prompts per step")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override the plan's tokens per prompt")
    parser.add_argument("--no-int8-draft", action="store_true", help="leave the int8-quantized draft out")
    add_threads_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true",
                        help="reuse every step whose output is already in DIR/results (from an interrupted or earlier "
                             "run with the same plan); a step whose recorded settings differ is measured again")
    parser.add_argument("--dry-run", action="store_true", help="print the plan's commands and stop")
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="run the alpha and bench steps' units as Ray tasks (see specdec bench --ray); the beam "
                             "steps run here")
    parser.add_argument("--shard-size", type=int, default=None, metavar="N",
                        help="prompts per unit of the alpha and bench steps (see specdec bench --shard-size)")
    parser.add_argument("--records", default=None, metavar="DIR",
                        help="keep each unit's records in DIR, written once: the same command run again resumes "
                             "where it stopped (default on Ray: OUT/results/units)")


def plan(args: argparse.Namespace) -> list[Step]:
    """The steps of a results run, each with the arguments of its ``specdec alpha`` / ``bench`` command."""
    p = QUICK if args.quick else FULL
    d = args.draft
    tasks = comma_list(args.tasks)
    parts = comma_list(args.parts)
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
        alpha_drafts = drafts(ALPHA_DRAFTS)
        for task in tasks:
            steps.append(Step("alpha", f"alpha_{step_stem(task)}", f"alpha, {task}", [
                *common, "--task", task, "--n-prompts", n(p["alpha"].get("per_task", {}).get(task, p["alpha"]["n_prompts"])),
                "--max-new-tokens", tokens(p["alpha"]["max_new_tokens"]), "--temperatures", TEMPERATURES,
                "--leniences", ALPHA_LENIENCES, "--drafts", *alpha_drafts]))
    if "speed" in parts:
        for task in tasks:
            count, length, gammas, specs = p["speed"].get(task, p["speed"]["*"])
            primary_gamma = str(DEFAULT_GAMMA) if str(DEFAULT_GAMMA) in gammas.split(",") else gammas.split(",")[-1]
            steps.append(Step("speed", f"speed_{step_stem(task)}", f"speed, {task}", [
                *common, "--task", task, "--n-prompts", n(count), "--max-new-tokens", tokens(length),
                "--temperatures", TEMPERATURES, "--gammas", gammas, "--gamma", primary_gamma,
                "--methods", SPEED_METHODS, "--drafts", *drafts(specs)]))
    code_task = "humaneval" if "humaneval" in tasks else tasks[0]
    if "extension" in parts:
        e = p["extension"]
        steps.append(Step("extension", f"extension_{step_stem(code_task)}",
                          f"fixed gamma vs schedules vs hierarchies, {code_task}", [
                              *common, "--task", code_task, "--n-prompts", n(e["n_prompts"]),
                              "--max-new-tokens", tokens(e["max_new_tokens"]), "--temperatures", EXTENSION_TEMPERATURES,
                              "--gammas", e["gammas"], "--gamma", str(DEFAULT_GAMMA), "--gamma-schedules", e["schedules"],
                              "--leniences", e["leniences"], "--methods", EXTENSION_METHODS,
                              "--drafts", *drafts(e["drafts"])]))
    if "beam" in parts:
        b = p["beam"]
        beam_tasks = [t for t in b["tasks"] if t in tasks] or [t for t in tasks if t != code_task][:1] or tasks[:1]
        for task in beam_tasks:
            own = b.get("per_task", {}).get(task, {})
            steps.append(Step("beam", f"beam_{step_stem(task)}", f"speculative beam search, {task}", options={
                "task": task, "n_prompts": args.n_prompts or own.get("n_prompts", b["n_prompts"]),
                "max_new_tokens": args.max_new_tokens or own.get("max_new_tokens", b["max_new_tokens"]),
                "widths": b["widths"], "draft": d, "gamma": BEAM_GAMMA, "seed": args.seed}))
    return steps


def step_stem(task: str) -> str:
    """A file-name stem for a task: its name, or KIND_FILENAME for a task read from a file."""
    kind, sep, rest = task.partition(":")
    text = f"{kind}_{Path(rest.split(',')[0]).name}" if sep else task
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)

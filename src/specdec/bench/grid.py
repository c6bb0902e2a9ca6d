"""What a bench run measures: the methods, the grid of settings, and the configurations (cells) it makes.

The grid: temperatures x drafts x constant gammas, plus each varying gamma schedule and each lenience
below 1 at the run's gamma. Every configuration is a :class:`Cell`, labelled the way the tables show it.
"""

from __future__ import annotations

import argparse
from dataclasses import astuple, dataclass, field

from specdec.sweeps.options import comma_list, number_list
from specdec.sweeps.pool import is_model_spec
from specdec.drafters import plan_draft
from specdec.bench.methods import LLAMA_METHODS, METHODS, default_methods
from specdec.models.llama_cpp import has_gguf
from specdec.errors import SpecDecError
from specdec.schedules import SCHEDULES

#: Peers with one configuration each, in the order the tables list them.
SINGLE_METHODS = ("specdec-plain", "hf-plain", "llama-cpp", "llama-cpp-lookup")


def select_methods(text: str | None, target: str) -> list[str]:
    """The methods of ``--methods`` (a comma list), or by default every method that can run here."""
    if text is None:
        return [m for m in default_methods() if m not in LLAMA_METHODS or has_gguf(target)]
    names = comma_list(text)
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise SpecDecError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(METHODS)}")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Grid:
    temperatures: list[float]
    drafts: list[str]
    gammas: list[int]
    schedules: list[str]
    leniences: list[float]
    assisted: list[str] | None = None  # drafts of transformers' assisted generation (None: the grid's own)
    verifications: list[str] = field(default_factory=lambda: ["token"])


def grid_from_args(args: argparse.Namespace) -> Grid:
    """The grid of the bench options, every list checked."""
    temperatures = number_list(args.temperatures, float, "--temperatures") if args.temperatures else [args.temperature]
    if any(t < 0 for t in temperatures):
        raise SpecDecError(f"temperatures must be >= 0, got {temperatures}")
    gammas = number_list(args.gammas, int, "--gammas") if args.gammas else [args.gamma]
    if any(g < 1 for g in gammas):
        raise SpecDecError(f"gammas must be >= 1, got {gammas}")
    schedules = comma_list(args.gamma_schedules)
    bad = [s for s in schedules if s not in SCHEDULES]
    if bad or not schedules:
        raise SpecDecError(f"unknown gamma schedule(s) {', '.join(bad) or '(none)'}; choose from {', '.join(SCHEDULES)}")
    leniences = number_list(args.leniences, float, "--leniences")
    if any(not 0 < l <= 1 for l in leniences):
        raise SpecDecError(f"leniences must be in (0, 1], got {leniences}")
    from specdec.acceptance import VERIFICATIONS

    verifications = comma_list(getattr(args, "verifications", None) or "token")
    bad = [v for v in verifications if v not in VERIFICATIONS]
    if bad:
        raise SpecDecError(f"unknown verification(s) {', '.join(bad)}; choose from {', '.join(VERIFICATIONS)}")
    drafts = list(args.drafts or [args.draft])
    for spec in drafts:
        plan_draft(spec)
    assisted = None
    if getattr(args, "hf_assisted_drafts", None):
        assisted = list(dict.fromkeys(args.hf_assisted_drafts))
        bad = [a for a in assisted if not (a == "prompt-lookup" or is_model_spec(a))]
        if bad:
            raise SpecDecError(f"--hf-assisted-drafts takes model names (NAME or NAME:int8) or prompt-lookup, got "
                               f"{', '.join(bad)}: transformers has no assisted generation with those")
    return Grid(temperatures, list(dict.fromkeys(drafts)), gammas, list(dict.fromkeys(schedules)), leniences, assisted,
                list(dict.fromkeys(verifications)))


@dataclass(frozen=True)
class Cell:
    """One configuration of the grid (at one temperature)."""

    label: str
    method: str
    draft: str | None = None
    gamma: int | None = None
    schedule: str = "constant"
    lenience: float = 1.0
    verification: str = "token"


def assisted_draft(spec: str) -> bool:
    """Whether transformers' assisted generation can draft with ``spec`` (a model, or its prompt lookup)."""
    return spec == "prompt-lookup" or is_model_spec(spec)


def _labelled(cells: list[Cell]) -> list[Cell]:
    """A single speculative or assisted configuration keeps the plain method name; several are told apart
    by draft, gamma, schedule and lenience."""
    if len(cells) == 1:
        return [Cell(cells[0].method, *astuple(cells[0])[1:])]
    out = []
    for c in cells:
        extra = (("" if c.schedule == "constant" else f",{c.schedule}") + ("" if c.lenience == 1.0 else f",l={c.lenience:g}")
                 + ("" if c.verification == "token" else f",{c.verification}"))
        out.append(Cell(f"{c.method}[{c.draft},gamma={c.gamma}{extra}]", *astuple(c)[1:]))
    return out


def build_cells(methods: list[str], grid: Grid, gamma: int) -> list[Cell]:
    """The configurations a run measures at each temperature, labelled."""
    spec: list[Cell] = []
    assisted: list[Cell] = []
    for draft in grid.drafts:
        if "specdec-spec" in methods:
            for schedule in grid.schedules:
                for g in (grid.gammas if schedule == "constant" else [gamma]):
                    spec.append(Cell("", "specdec-spec", draft, g, schedule))
            for l in grid.leniences:
                if l < 1.0:
                    spec.append(Cell("", "specdec-spec", draft, gamma, "constant", l))
            for v in grid.verifications:  # each other verification: a run at --gamma, the first schedule
                if v != "token":
                    spec.append(Cell("", "specdec-spec", draft, gamma, grid.schedules[0], 1.0, v))
        if "hf-assisted" in methods and grid.assisted is None and assisted_draft(draft):
            assisted.append(Cell("", "hf-assisted", draft, gamma))
    if "hf-assisted" in methods and grid.assisted is not None:
        assisted = [Cell("", "hf-assisted", draft, gamma) for draft in grid.assisted]
    cells = [Cell(m, m) for m in SINGLE_METHODS if m in methods]
    return cells + _labelled(spec) + _labelled(assisted)


def skipped_assisted(methods: list[str], grid: Grid) -> dict[str, str]:
    """The assisted configurations transformers cannot run (drafts without weights it could use), and why."""
    if "hf-assisted" not in methods or grid.assisted is not None:
        return {}
    return {f"hf-assisted[{spec}]": f"transformers has no assisted generation with the {spec!r} draft"
            for spec in grid.drafts if not assisted_draft(spec)}

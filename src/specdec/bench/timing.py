"""Synchronized timing: one timed call, and the direct cost of single cached forward passes.

Every clock reading goes through :class:`specdec.devices.Stopwatch`, which waits for the device's
queued work first, so a GPU's asynchronous kernels are timed where they run.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any, Callable

import torch

from specdec.drafters import plan_draft
from specdec.devices import Stopwatch
from specdec.models import LanguageModel, same_vocabulary

#: Timed passes per forward-pass cost (their median is reported; one more, untimed, comes first).
COST_REPEATS = 5


def timed(fn: Callable[[], Any], device: Any = None) -> tuple[Any, float, float]:
    """fn's result, its wall seconds and this process's CPU seconds over the call.

    CPU seconds / wall seconds near the torch thread count means the call had the cores to itself;
    much lower means other work shared the CPU and the timing is not to be trusted.
    """
    gc.collect()
    clock = Stopwatch(device)
    with torch.inference_mode():
        c0 = time.process_time()
        t0 = clock()  # synchronizes a GPU first: only this call's work is timed
        result = fn()
        seconds = clock() - t0
        cpu = time.process_time() - c0
    return result, seconds, cpu


def alternated(run: Callable[[], Any], switch: Callable[[Any], Any], ways: tuple[Any, Any], n: int) -> dict:
    """``run()`` ``n`` times each of two ways (``switch(way)`` before each call), the order alternating within each
    pair, after one untimed call: a CPU whose speed moves within seconds times both ways at the same moments. The
    switch is left at ``ways[0]``. Returns the medians (``a_s``, ``b_s``), the median of the pairs' ratios a / b and
    the share of pairs way a won."""
    a, b = ways
    run()
    times: dict[Any, list[float]] = {a: [], b: []}
    for i in range(n):
        for way in ((a, b) if i % 2 == 0 else (b, a)):
            switch(way)
            t0 = time.perf_counter()
            run()
            times[way].append(time.perf_counter() - t0)
    switch(a)
    ratios = [x / y for x, y in zip(times[a], times[b])]
    return {"a_s": median(times[a]), "b_s": median(times[b]), "median_pair_ratio": median(ratios),
            "a_won": sum(r < 1 for r in ratios) / len(ratios)}


def forward_time(model: LanguageModel, prompt_ids: list[int], k: int, repeats: int = COST_REPEATS) -> float:
    """Median seconds of one cached forward pass over k new tokens at the end of ``prompt_ids``.

    The prompt but its last k tokens is prefilled once, then the last k tokens are fed again and again
    (rolled back after each pass); the first pass of this shape is untimed (first-call effects, graph
    capture). The device is synchronized around every timed pass.
    """
    session, start = model.start(prompt_ids, len(prompt_ids) + k + 1)  # a causal LM starts from the prompt
    k = min(k, len(start) - 1)
    clock = Stopwatch(model.device)
    session.prefill(start[:-k])
    tail = start[-k:]
    times = []
    for _ in range(repeats + 1):
        t0 = clock()
        session.extend(tail, k)
        times.append(clock() - t0)
        session.rollback(len(start) - k)
    session.close()
    return median(times[1:])


def _own_tokens(model: LanguageModel, target: LanguageModel, ids: list[int]) -> list[int]:
    """``ids`` (target tokens) as ``model``'s tokens: the same ids when they share a vocabulary, else the text."""
    if same_vocabulary(target, model):
        return ids
    from specdec.drafters.retokenized import decode_text, encode_text

    return encode_text(model.tokenizer, decode_text(target.tokenizer, ids)) or ids[:1]


@dataclass
class DraftCosts:
    """One draft's models' one-token steps, in level order (a hierarchy lists each of its models)."""

    models: list[str]
    k1_s: list[float]  # median seconds of one cached one-token step of each model
    c_levels: list[float]  # each of them / the target's one-token step
    c_direct: float | None  # the paper's c, for a draft that is one model


@dataclass
class StepCosts:
    """Median times of single cached forward passes, measured once per run."""

    repeats: int
    target_s: dict[int, float]  # k new tokens -> seconds of one target pass over them
    verify_tokens: dict[int, int]  # gamma -> tokens its verification scores (gamma + 1, at most the prompt)
    drafts: dict[str, DraftCosts] = field(default_factory=dict)

    @property
    def target_k1_s(self) -> float:
        return self.target_s[1]

    def verify_cost_ratio(self, gamma: int) -> float | None:
        """A verification of ``gamma`` drafted tokens over one plain step (None: not measured)."""
        k = self.verify_tokens.get(gamma)
        return None if k is None else self.target_s[k] / self.target_k1_s

    def to_dict(self) -> dict[str, Any]:
        """The layout of the bench document (JSON keys are strings)."""
        return {"repeats": self.repeats, "target_k1_s": self.target_k1_s,
                "target_s": {str(k): v for k, v in self.target_s.items()},
                "verify_tokens": {str(g): k for g, k in self.verify_tokens.items()},
                "verify_cost_ratio": {str(g): self.verify_cost_ratio(g) for g in self.verify_tokens},
                "drafts": {spec: asdict(d) for spec, d in self.drafts.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepCosts":
        return cls(d["repeats"], {int(k): v for k, v in d["target_s"].items()},
                   {int(g): k for g, k in d["verify_tokens"].items()},
                   {spec: DraftCosts(**e) for spec, e in d["drafts"].items()})


def measure_costs(target: LanguageModel, models: dict[str, list[LanguageModel]], prompt_ids: list[int],
                  gammas: list[int], repeats: int = COST_REPEATS) -> StepCosts:
    """The target over 1 and over gamma + 1 new tokens (each gamma), and every draft model over 1.
    c_direct = draft(1) / target(1) for a draft that is one model (the paper's c); hierarchies list the
    c of each of their models."""
    seq = list(prompt_ids)
    t1 = forward_time(target, seq, 1, repeats)
    costs = StepCosts(repeats, {1: t1}, {})
    for g in gammas:
        k = min(g + 1, len(seq))
        if k not in costs.target_s:
            costs.target_s[k] = forward_time(target, seq, k, repeats)
        costs.verify_tokens[g] = k
    seen: dict[int, float] = {}
    for spec, levels in models.items():
        times = []
        for m in levels:
            if id(m) not in seen:  # a draft with another tokenizer reads the prompt's text in its own tokens
                seen[id(m)] = forward_time(m, _own_tokens(m, target, seq), 1, repeats)
            times.append(seen[id(m)])
        one_model = len(levels) == 1 and len(plan_draft(spec).levels) == 1
        costs.drafts[spec] = DraftCosts([m.name for m in levels], times, [t / t1 for t in times],
                                        times[0] / t1 if one_model else None)
    return costs


def primary_step_costs(costs: StepCosts | None, primary: str, gamma: int) -> dict[str, Any] | None:
    """The primary configuration's costs in the single-configuration layout (``step_costs`` of the document)."""
    if costs is None:
        return None
    k = costs.verify_tokens[gamma]
    out = {"target_k1_s": costs.target_k1_s, f"target_k{k}_s": costs.target_s[k],
           "verify_cost_ratio": costs.verify_cost_ratio(gamma), "verify_tokens": k}
    entry = costs.drafts.get(primary)
    if entry and entry.c_direct is not None:
        out["draft_k1_s"] = entry.k1_s[0]
        out["c_direct"] = entry.c_direct
    return out

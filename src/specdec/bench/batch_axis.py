"""The batch axis of ``specdec bench`` (``--batch-sizes 1,4,8``), and Theorem 8 extended to a batch.

Every prompt of the task goes through the batch engine (:mod:`specdec.batch.engine`) with at most B rows at
once (continuous batching: a prompt joins as a row finishes), plain and with each draft at each constant
gamma and each varying schedule of the grid (``--gamma-schedules constant,adaptive --gamma 6``: the batch's shared
adaptive gamma, :class:`specdec.schedules.BatchGamma`), at every B. A round over B rows makes gamma draft steps over
the B rows (D(B) seconds each) and one target pass over B (gamma + 1) tokens (T(B (gamma + 1)) seconds), and
yields sum_i E(alpha_i, gamma) tokens, where plain decoding yields B tokens per T(B). Speculation over B rows therefore gains

    speedup(B) = E(alpha, gamma) / (gamma c_B + v_B),   c_B = D(B) / T(B),   v_B = T(B (gamma + 1)) / T(B)

(Theorem 8 is B = 1 with v = 1, a pass over gamma + 1 tokens costing what one costs). As B grows the
pass over B (gamma + 1) tokens stops being bound by reading the weights, v_B grows, and speculation
stops paying where speedup(B) < 1. D and T are the engine's own timers in the same runs (seconds per
draft step by rows, per target pass by tokens fed); the measured speedup is tokens/s with the draft
over plain tokens/s at the same B. A varying schedule has no single gamma to predict with (no Theorem 8 there);
every speculative row reports the tokens it drafted a target call.
"""

from __future__ import annotations

from typing import Any

from specdec.analysis import expected_tokens
from specdec.analysis.values import ratio
from specdec.bench.grid import Cell
from specdec.bench.timing import timed
from specdec.config import GenerationConfig
from specdec.errors import SpecDecError


def batch_cells(cells: list[Cell]) -> list[Cell]:
    """The configurations with a batch axis: plain, and each exact speculative one (every gamma schedule)."""
    return [c for c in cells if c.method == "specdec-plain" or (
        c.method == "specdec-spec" and c.lenience == 1.0 and c.verification == "token")]


def run_batch(target: Any, draft: Any, cell: Cell, prompts: list[list[int]], batch: int, temperature: float,
              max_new_tokens: int, seed: int) -> dict[str, Any]:
    """One timed run of every prompt through the batch engine, at most ``batch`` rows at once."""
    from specdec.batch.engine import batch_engine

    config = GenerationConfig.from_options(gamma=cell.gamma or 1, gamma_schedule=cell.schedule,
                                           temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    record: dict[str, Any] = {"record": "batch", "temperature": temperature, "batch": batch, "label": cell.label,
                              "draft": cell.draft, "gamma": cell.gamma, "schedule": cell.schedule}
    try:
        engine, row_draft = batch_engine(target, draft if cell.draft else None, [config], batch)
    except SpecDecError as e:  # a draft with another tokenizer, a llama.cpp draft: one sequence at a time only
        return {**record, "skipped": str(e)}
    rows = [engine.add(ids, config, draft=row_draft) for ids in prompts]
    _, seconds, cpu = timed(engine.run, target.device)
    stats = [row.output.stats for row in rows]
    return {**record, "tokens": [list(row.output.token_ids) for row in rows], "seconds": seconds,
            "cpu_seconds": cpu, "beta_sum": sum(s.beta_sum for s in stats), "beta_count": sum(s.beta_count for s in stats),
            "drafted": sum(s.drafted for s in stats), "row_calls": sum(s.target_calls for s in stats),
            "target_calls": engine.rounds,
            "target_time": {str(k): v for k, v in engine.gamma_policy.target_time.items()},  # tokens fed -> s
            "draft_time": {str(k): v for k, v in engine.gamma_policy.draft_time.items()}}  # rows -> s per step


def batch_rows(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One temperature's batch records -> a row per (B, configuration) with the batch Theorem 8 beside the
    measurement, and for each draft the smallest B where speculation stopped paying."""
    ran = [r for r in records if "skipped" not in r]
    plain = {r["batch"]: r for r in ran if r["draft"] is None}
    rows = []
    for r in ran:
        tokens = sum(len(t) for t in r["tokens"])
        row = {"batch": r["batch"], "label": r["label"], "draft": r["draft"], "gamma": r["gamma"],
               "new_tokens": tokens, "seconds": r["seconds"], "tokens_per_second": ratio(tokens, r["seconds"]),
               "target_calls": r["target_calls"]}
        base = plain.get(r["batch"])
        if r["draft"] is not None and base is not None:
            b, g = r["batch"], r["gamma"]
            constant = r.get("schedule", "constant") == "constant"
            t_plain = base["target_time"].get(str(b))
            alpha = ratio(r["beta_sum"], r["beta_count"])
            c_b = ratio(r["draft_time"].get(str(b)), t_plain)
            v_b = ratio(r["target_time"].get(str(b * (g + 1))), t_plain) if constant else None
            predicted = (expected_tokens(min(alpha, 1.0), g) / (g * c_b + v_b)
                         if None not in (alpha, c_b, v_b) else None)
            row["drafted_per_call"] = ratio(r.get("drafted"), r.get("row_calls"))  # what the schedule drafted
            plain_rate = ratio(sum(len(t) for t in base["tokens"]), base["seconds"])
            same = sum(a == p for a, p in zip(r["tokens"], base["tokens"]))
            row.update(alpha=alpha, c_batch=c_b, verify_cost_ratio_batch=v_b, predicted_speedup=predicted,
                       speedup_vs_plain=ratio(row["tokens_per_second"], plain_rate),
                       identical_to_plain=f"{same}/{len(r['tokens'])}" if r["temperature"] == 0 else None)
        rows.append(row)
    stops: dict[str, int | None] = {}
    for row in sorted(rows, key=lambda x: x["batch"]):
        if row["draft"] is not None:
            slower = row.get("speedup_vs_plain") is not None and row["speedup_vs_plain"] < 1
            stops.setdefault(row["label"], None)
            if slower and stops[row["label"]] is None:
                stops[row["label"]] = row["batch"]
    return {"rows": rows, "stops_paying_at": stops,
            "skipped": {f"{r['label']} (B={r['batch']})": r["skipped"] for r in records if "skipped" in r}}

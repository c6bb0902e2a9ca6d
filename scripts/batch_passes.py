"""What a batch's passes cost with the decoder step and with transformers' forward: the batch engine of
``specdec serve`` (the CPU default pair), its target's pass over 1-8 rows x 1-5 tokens and its draft's step over 1-8
rows, timed by ``BatchEngine.calibrate`` (the times the batch's speculation decides from) with the models' batch
passes through specdec's decoder step, packed (:func:`specdec.models.native.decoder_step.step_packed`, the default),
and through transformers' padded forward, alternately (``--rounds`` each, the best time per cell kept), in one
process. Both give the same bits (a check at the end: one round of 4 ragged rows, logits ``torch.equal``).

    python scripts/batch_passes.py --rounds 3 --out docs/results/batch_passes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def calibrated(engine, context: int) -> dict:
    from specdec.batch.measuring import calibrate

    return calibrate(engine, context=context)


def mixed(engine, context: int, rows: int, wide: int) -> float:
    """The best of 3 target passes where one of ``rows`` rows feeds ``wide`` tokens (a long prediction or lookup
    proposal) and the others 1 (plain rows): padded, every row is ``wide`` tokens; packed, the tokens fed."""
    import time

    import torch

    session = engine.target_session
    ids = [(7 * i) % 5000 + 1 for i in range(context)]
    session.prefill(0, ids)
    for slot in range(1, rows):
        session.move(0, slot)
    best = float("inf")
    for _ in range(3):
        feeds = [torch.tensor(ids[:wide])] + [torch.tensor(ids[:1])] * (rows - 1)
        start = time.perf_counter()
        session.extend(feeds, [len(f) for f in feeds])
        best = min(best, time.perf_counter() - start)
        for slot in range(rows):
            session.rollback(slot, context)
    for slot in range(rows):
        session.rollback(slot, 0)
    return best


def same_logits(engine, enabled) -> bool:
    """One ragged pass of 4 rows, decoder step on and off: the same logits."""
    import torch

    session = engine.target_session
    prompts = [[(11 * i + 7 * j) % 5000 + 1 for j in range(40 + 9 * i)] for i in range(4)]
    out = []
    for on in (True, False):
        enabled(on)
        for slot, p in enumerate(prompts):
            session.prefill(slot, p)
        feeds = [torch.tensor(p[:1 + i]) for i, p in enumerate(prompts)]
        out.append(torch.cat(session.extend(feeds, [len(f) for f in feeds])))
        for slot in range(4):
            session.rollback(slot, 0)
    enabled(True)
    return torch.equal(out[0], out[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timings of each side, alternating")
    parser.add_argument("--context", type=int, default=256, help="positions each row holds when timed")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import specdec
    from specdec.cli.serve import batch_engine
    from specdec.config import DEFAULT_TARGET, preset_draft
    from specdec.models.native import decoder_step
    from specdec.sweeps.machine import machine_info

    target = specdec.load(DEFAULT_TARGET)  # the CPU default: the exact quantized target
    draft = preset_draft(target)  # serve's default draft (the Python API's default)
    engine = batch_engine(target, draft, args.max_batch, 4096, None, None, None, 0)
    models = [target.hf_model, engine.draft_session.model.hf_model]

    def enabled(on: bool) -> None:
        for m in models:
            decoder_step.set_enabled(m, on)

    best: dict[str, dict[str, dict]] = {"decoder step": {}, "transformers": {}}
    mixes = [(4, 17), (8, 17), (4, 33)]  # (rows, the wide row's tokens)
    for _ in range(args.rounds):
        for side, on in (("decoder step", True), ("transformers", False)):
            enabled(on)
            for part, times in calibrated(engine, args.context).items():
                cell = best[side].setdefault(part, {})
                for n, s in times.items():
                    cell[n] = min(cell.get(n, float("inf")), s)
            cell = best[side].setdefault("mixed", {})
            for rows, wide in mixes:
                key = f"{rows} rows: 1 x {wide} + {rows - 1} x 1"
                cell[key] = min(cell.get(key, float("inf")), mixed(engine, args.context, rows, wide))
    enabled(True)
    same = same_logits(engine, enabled)
    ours, theirs = best["decoder step"], best["transformers"]
    lines = [f"# A batch's passes, decoder step against transformers' forward ({target.name}, draft "
             f"{engine.draft_session.model.name}; {args.context} positions a row; best of {args.rounds})", "",
             "| pass | tokens fed | decoder step, ms | transformers, ms | speed-up |", "|---|---|---|---|---|"]
    for part, label in (("target", "target, rows x tokens"), ("draft", "draft step, rows"),
                        ("mixed", "target, one wide row")):
        for n in sorted(ours.get(part, {})):
            a, b = ours[part][n] * 1e3, theirs[part][n] * 1e3
            lines.append(f"| {label} | {n} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    lines += ["", f"Logits identical (4 ragged rows, one pass): {same}."]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "batch_passes.md").write_text("\n".join(lines) + "\n")
        doc = {"machine": machine_info("int4-mixed target"), "context": args.context, "rounds": args.rounds,
               "seconds": best, "identical": same}
        (args.out / "batch_passes.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

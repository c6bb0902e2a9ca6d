"""What a batch's passes cost with the decoder step and with transformers' forward: the batch engine of ``specdec serve``
(the CPU default pair), its target's pass over 1-8 rows x 1-5 tokens and its draft's step over 1-8 rows, timed by
``BatchEngine.calibrate`` (the times the batch's speculation decides from) with the models' ragged passes through
specdec's decoder step (:func:`specdec.models.native.decoder_step.step_rows`, the default) and through transformers'
forward, alternately (``--rounds`` each, the best time per cell kept), in one process. Both give the same bits (a
check at the end: one round of 4 rows, logits ``torch.equal``).

    python scripts/batch_passes.py --rounds 3 --out docs/results/batch_passes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def calibrated(engine, context: int) -> dict:
    from specdec.batch.speculation import calibrate

    return calibrate(engine, context=context)


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
    from specdec.config import DEFAULT_TARGET, default_draft
    from specdec.drafters import plan_draft
    from specdec.models.native import decoder_step
    from specdec.sweeps.machine import machine_info

    target = specdec.load(DEFAULT_TARGET)  # the CPU default: the exact quantized target
    draft = plan_draft(default_draft(target.device)).load(target).draft  # serve's default draft
    engine = batch_engine(target, draft, args.max_batch, 4096, None, None, None, 0)
    models = [target.hf_model, engine.draft_session.model.hf_model]

    def enabled(on: bool) -> None:
        for m in models:
            decoder_step.set_enabled(m, on)

    best: dict[str, dict[str, dict[int, float]]] = {"decoder step": {}, "transformers": {}}
    for _ in range(args.rounds):
        for side, on in (("decoder step", True), ("transformers", False)):
            enabled(on)
            for part, times in calibrated(engine, args.context).items():
                cell = best[side].setdefault(part, {})
                for n, s in times.items():
                    cell[n] = min(cell.get(n, float("inf")), s)
    enabled(True)
    same = same_logits(engine, enabled)
    ours, theirs = best["decoder step"], best["transformers"]
    lines = [f"# A batch's passes, decoder step against transformers' forward ({target.name}, draft "
             f"{engine.draft_session.model.name}; {args.context} positions a row; best of {args.rounds})", "",
             "| pass | tokens fed | decoder step, ms | transformers, ms | speed-up |", "|---|---|---|---|---|"]
    for part, label in (("target", "target, rows x tokens"), ("draft", "draft step, rows")):
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

"""What one cached forward pass over k new tokens costs, per model and weight format, on this CPU.

    python scripts/step_costs.py                       # the Qwen pair in bf16, fp32 and int8; k = 1, 5, 7
    python scripts/step_costs.py --ks 1,2,3,5,7 --json out.json
    python scripts/step_costs.py --models qwen2.5-coder-1.5b --formats bf16,int8,int8-per-pass --ks 1,5,8
    python scripts/step_costs.py --models qwen2.5-coder-1.5b --formats int4-mixed --ks 1,5,8 --both-paths

``int8-per-pass`` is the int8 model with torch's own per-pass activation scale (not block-invariant) and
stock SDPA attention: what the block-invariant int8 form costs over it. ``--both-paths`` times the int8 / int4
models (specdec's kernel) also with transformers' forward instead of the decoder step (specdec.models.native.decoder_step;
the same bits), the two alternated in one process. The last column says whether the
logits of the widest pass equal that many one-token steps bit for bit (the int8 target's exactness).

Speculative decoding pays when the target verifies gamma + 1 tokens for little more than the price of
one (the paper's assumption, s = 0 in :mod:`specdec.analysis`). Whether it does depends on the CPU's
matrix kernels: this prints T(k) and T(k) / T(1), and the marginal cost s = (T(k) / T(1) - 1) / (k - 1)
that the adaptive gamma schedule estimates during decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import specdec  # first: it picks OpenMP's wait policy before torch loads the runtime (specdec/__init__.py)
import torch  # noqa: E402
from specdec.bench.timing import forward_time
from specdec.models.native import decoder_step

FORMATS = {"bf16": {"dtype": "bf16"}, "fp32": {"dtype": "fp32"}, "int8": {"quantize": "int8"},
           "int8-per-pass": {"quantize": "int8"}, "int4": {"quantize": "int4"}, "int4-mixed": {"quantize": "int4-mixed"}}


def per_pass(model: specdec.LanguageModel) -> specdec.LanguageModel:
    """The int8 ``model`` with torch's per-pass activation scale and transformers' SDPA attention."""
    from specdec.models.quantized.quantize import Int8Linear

    for layer in model.hf_model.modules():
        if isinstance(layer, Int8Linear):
            layer.pinned = False
    model.block_invariant = False
    model.hf_model.set_attn_implementation("sdpa")
    return model


def block_equals_steps(model: specdec.LanguageModel, k: int, context: int) -> tuple[bool, float]:
    """Whether one k-token pass gives the logits of k one-token steps bit for bit; the largest difference."""
    ids = list(range(1000, 1000 + context + k))
    out = []
    for widths in ([1] * k, [k]):
        session, _ = model.start(ids, len(ids) + 1)
        session.prefill(ids[:context])
        at, rows = context, []
        for w in widths:
            rows.append(session.extend(ids[at:at + w], w))
            at += w
        session.close()
        out.append(torch.cat(rows).float())
    return torch.equal(out[0], out[1]), float((out[0] - out[1]).abs().max())


def step_ms(model: specdec.LanguageModel, k: int, context: int, reps: int) -> float:
    """Median milliseconds of a forward pass over k new tokens after ``context`` cached tokens."""
    return 1000 * forward_time(model, list(range(1000, 1000 + context + k)), k, reps)


def prefill_ms(model: specdec.LanguageModel, context: int, reps: int) -> float:
    """Median milliseconds of a prefill of ``context`` tokens into a new session (the first one untimed)."""
    import time
    from statistics import median

    ids = list(range(1000, 1000 + context))
    times = []
    for _ in range(reps + 1):
        session, start = model.start(ids, len(ids) + 1)
        t0 = time.perf_counter()
        session.prefill(start)
        times.append(time.perf_counter() - t0)
        session.close()
    return 1000 * median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-1.5b,qwen2.5-coder-0.5b")
    parser.add_argument("--formats", default="bf16,fp32,int8",
                        help="comma list out of " + ", ".join(FORMATS))
    parser.add_argument("--ks", default="1,5,7", help="comma list of pass sizes (1 is always measured)")
    parser.add_argument("--context", type=int, default=300, help="cached tokens before the timed passes")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--prefill", action="store_true", help="also time a prefill of --context tokens")
    parser.add_argument("--both-paths", action="store_true",
                        help="quantized models: also time transformers' forward in place of the decoder step")
    args = parser.parse_args()

    ks = sorted({1, *(int(k) for k in args.ks.split(","))})
    print(f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY')}; CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; {args.context} cached tokens, median of {args.reps} (--both-paths: the lower of two alternated medians)")
    print("| model | format | " + " | ".join(f"k={k} ms" for k in ks)
          + f" | T({ks[-1]}) / T(1) | s | {ks[-1]}-token pass = {ks[-1]} steps? |"
          + (f" prefill {args.context} ms |" if args.prefill else ""))
    print("|---|---|" + "---|" * (len(ks) + 3 + args.prefill))
    rows = []
    for name in args.models.split(","):
        for fmt in args.formats.split(","):
            model = specdec.load(name, **FORMATS[fmt])
            if fmt == "int8-per-pass":
                model = per_pass(model)
            paths = [True, False] if args.both_paths and "quantize" in FORMATS[fmt] and fmt != "int8-per-pass" else [None]
            timed = {path: {k: [] for k in ks} for path in paths}
            for _ in range(2 if len(paths) > 1 else 1):  # alternated: both paths see the same machine
                for path in paths:
                    if path is not None:
                        decoder_step.set_enabled(model.hf_model, path)
                    for k in ks:
                        timed[path][k].append(step_ms(model, k, args.context, args.reps))
            for path in paths:
                ms = {k: min(v) for k, v in timed[path].items()}
                if path is not None:
                    decoder_step.set_enabled(model.hf_model, path)
                label = fmt if path is None else f"{fmt} ({'decoder step' if path else 'transformers forward'})"
                ratio = ms[ks[-1]] / ms[1]
                s = (ratio - 1) / (ks[-1] - 1) if ks[-1] > 1 else 0.0
                same, diff = block_equals_steps(model, ks[-1], args.context)
                prefill = prefill_ms(model, args.context, args.reps) if args.prefill else None
                rows.append({"model": name, "format": label, "ms": ms, "ratio": ratio, "s": s,
                             "block_equals_steps": same, "max_abs_difference": diff, "prefill_ms": prefill})
                print(f"| {name} | {label} | " + " | ".join(f"{ms[k]:.1f}" for k in ks) + f" | {ratio:.2f} | {s:.2f} | "
                      + ("yes, bit for bit" if same else f"no: {diff:.3g}") + " |"
                      + (f" {prefill:.0f} |" if prefill is not None else ""), flush=True)
            del model
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpu_capability": torch.backends.cpu.get_cpu_capability(), "config": vars(args),
                       "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

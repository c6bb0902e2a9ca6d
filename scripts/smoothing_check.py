"""How far the int8 target's logits are from the float model's, with and without SmoothQuant-style smoothing.

    python scripts/smoothing_check.py --alphas 0,0.5,0.75 --json docs/results/smoothing/check.json
    python scripts/smoothing_check.py --translation 0.5 --out docs/results/smoothing/translation_alpha0.5

The second runs `specdec bench --task translation --n-prompts 40 --max-new-tokens 64 --methods specdec-plain` (the
quality rule's chrF) on the int8 target smoothed with that alpha.

Calibration (the activation maxima): shipped text and code that no benchmark evaluates
(:func:`calibration_texts` below: German sentences of the translation corpus, its first half; six
man pages of the summarization task; Python standard-library modules). Scored: held-out text of the same kinds (the
corpus's other half, other modules). For each alpha (0 = no smoothing: the int8 target as it is) a fresh float32
model is smoothed, quantized to int8 and scored against the float32 model's logits: mean KL(p_float || p_int8) a
token and how often the argmax agrees.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time

import torch

import specdec
from specdec.analysis import logit_distance
from specdec.models.quantized.quantize import quantize_model
from specdec.models.quantized.smoothing import activation_maxima, smooth


# shipped text and code that no benchmark evaluates (the translation task evaluates English sources, HumanEval Python)
CALIBRATION_MODULES = ("heapq", "bisect", "textwrap", "statistics", "fractions", "difflib")


def calibration_texts(which: str = "calibration") -> list[str]:
    """Calibration text: the first half of the translation corpus's German sentences, six of the summarization
    task's man pages and Python standard-library modules (:data:`CALIBRATION_MODULES`). ``which="held_out"``: the
    corpus's other half and other modules, for scoring (``scripts/smoothing_check.py``)."""
    from specdec.tasks.catalog import SUMMARIZATION_FILE, TRANSLATION_CORPUS_FILE, jsonl_records

    german = TRANSLATION_CORPUS_FILE.read_text(encoding="utf-8").splitlines()
    half = len(german) // 2
    if which == "held_out":
        modules = ("random", "shlex", "colorsys", "graphlib", "calendar")
        return ["\n".join(german[half:])] + [inspect.getsource(__import__(m)) for m in modules]
    man = [r.get("text") or json.dumps(r) for r in jsonl_records(SUMMARIZATION_FILE)[:6]]
    return ["\n".join(german[:half])] + man + [inspect.getsource(__import__(m)) for m in CALIBRATION_MODULES]


def token_batches(tokenizer, texts: list[str], length: int = 256, per_text: int = 2) -> list[torch.Tensor]:
    """Up to ``per_text`` sequences ``[1, length]`` of token ids from the start of each text."""
    out = []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        starts = range(0, min(len(ids), per_text * length) - length + 1, length)
        out += [torch.tensor([ids[i:i + length]]) for i in starts]
    return out


def smoothed_int8(name: str, alpha: float = 0.5, maxima: dict[str, torch.Tensor] | None = None):
    """The preset (or model) ``name`` in float32, smoothed with ``alpha`` (the activation maxima of
    :func:`calibration_texts`, or ``maxima``), then quantized to the block-invariant int8 target."""
    model = specdec.load(name, dtype="fp32")
    if maxima is None:
        maxima = activation_maxima(model.hf_model, token_batches(model.tokenizer, calibration_texts()))
    if alpha > 0:
        smooth(model.hf_model, maxima, alpha)
    quantize_model(model, "int8")
    model.name = model.name.replace("+int8", f"+int8-smooth{alpha:g}")
    return model


@torch.no_grad()
def logits(model, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model.hf_model(input_ids=ids, use_cache=False).logits[0].float() for ids in batches]


def translation(target: str, alpha: float, out: str | None) -> int:
    from specdec.bench.runner import run
    from specdec.cli.parser import build_parser
    from specdec.publish.tables import publish

    bench = build_parser().parse_args(["bench", "--target", target, "--task", "translation", "--n-prompts", "40",
                                       "--max-new-tokens", "64", "--methods", "specdec-plain", "--threads", "2"])
    publish(run(bench, target=smoothed_int8(target, alpha)), None, out)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--alphas", default="0,0.5,0.75")
    parser.add_argument("--length", type=int, default=256, help="tokens a sequence")
    parser.add_argument("--json")
    parser.add_argument("--translation", type=float, metavar="ALPHA", help="chrF of the target smoothed with ALPHA")
    parser.add_argument("--out", help="--translation: the bench's output folder")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.translation is not None:
        return translation(args.target, args.translation, args.out)
    float_model = specdec.load(args.target, dtype="fp32")
    held_out = token_batches(float_model.tokenizer, calibration_texts("held_out"), args.length)
    calibration = token_batches(float_model.tokenizer, calibration_texts(), args.length)
    t = time.perf_counter()
    reference = logits(float_model, held_out)
    maxima = activation_maxima(float_model.hf_model, calibration)
    print(f"{len(calibration)} calibration and {len(held_out)} held-out sequences of {args.length} tokens "
          f"({time.perf_counter() - t:.0f} s)", flush=True)
    del float_model
    rows = []
    for alpha in [float(a) for a in args.alphas.split(",")]:
        model = smoothed_int8(args.target, alpha, maxima)
        kl, agree, n = 0.0, 0, 0
        for ref, out in zip(reference, logits(model, held_out)):
            d = logit_distance(ref, out)
            kl += d.kl.sum().item()
            agree += d.agree.sum().item()
            n += ref.shape[0]
        rows.append({"alpha": alpha, "mean_kl": kl / n, "argmax_agreement": agree / n, "tokens": n})
        print(f"alpha {alpha}: mean KL(float || int8) {kl / n:.4f} nats a token, argmax agrees on {agree / n:.4f} "
              f"of {n} tokens", flush=True)
        del model
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "length": args.length, "calibration_sequences": len(calibration),
                       "held_out_sequences": len(held_out), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

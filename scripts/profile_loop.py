"""Where the time of speculative decoding goes: model compute vs everything the loop adds.

    python scripts/profile_loop.py                         # Qwen pair, bf16, int8 draft, gamma 4, greedy
    python scripts/profile_loop.py --draft-quantize none --temperature 1 --json out.json
    python scripts/profile_loop.py --device cuda --random-weights --draft-quantize none --torch-profile 25

Runs ``specdec.generate`` on HumanEval prompts and attributes the wall time of every call to:

- target forward / draft forward: inside the models' ``hf_model.forward`` (the network itself, with
  transformers' own Python around it);
- sampling and acceptance: ``standardize``, ``speculative_sampling``, ``greedy_verification`` and the
  argmax / softmax of the loop and the drafter (:mod:`specdec.acceptance`, :mod:`specdec.sampling`);
- captured steps: CUDA-graph steps, target's and draft's (copy the inputs in, replay, copy the logits out);
- cache rollback: ``DynamicCache.crop`` (rollback is position bookkeeping plus this crop);
- loop overhead: the rest (drafter and loop bookkeeping, statistics, token lists, tensor creation).

On a GPU the times are the host's (the device runs asynchronously; graph replays are launches), which is
what they are for there: where the host spends a round while the device may wait. ``--torch-profile N``
adds the N ops with the most host time (PyTorch's profiler over the same generations), per target call,
with the CUDA runtime calls (kernel and graph launches, copies, synchronizations) among them.

The timers wrap functions by name, so the same script also profiles older checkouts of specdec
(``PYTHONPATH=/path/to/old/src python scripts/profile_loop.py``): functions an old version lacks are
simply counted in "loop overhead".
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections import defaultdict
from typing import Any, Callable

import torch

import specdec

TIMES: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
_ACTIVE: list[str] = []  # the innermost timed region wins: nested time is not counted twice


def timed(label: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outer = _ACTIVE[-1] if _ACTIVE else None
        _ACTIVE.append(label)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            _ACTIVE.pop()
            TIMES[label] += dt
            CALLS[label] += 1
            if outer is not None:
                TIMES[outer] -= dt  # exclusive time
    return wrapper


def patch(module: Any, name: str, label: str) -> None:
    if hasattr(module, name):
        setattr(module, name, timed(label, getattr(module, name)))


def instrument(target: Any, draft: Any) -> None:
    target.hf_model.forward = timed("target forward", target.hf_model.forward)
    if draft is not None and hasattr(draft, "hf_model"):
        draft.hf_model.forward = timed("draft forward", draft.hf_model.forward)
    import specdec.acceptance as acceptance
    import specdec.decoding as decoding
    import specdec.sampling as sampling

    modules = [decoding, sampling, acceptance]
    try:
        import specdec.drafters.model as drafter_model
        modules.append(drafter_model)
    except ImportError:
        pass
    for module in modules:  # the names each module imported, and the originals
        for name in ("standardize", "speculative_sampling", "greedy_verification", "acceptance_probability",
                     "lenient_greedy_mask", "argmax", "sample", "residual_distribution"):
            patch(module, name, "sampling and acceptance")
    from transformers import DynamicCache
    DynamicCache.crop = timed("cache rollback", DynamicCache.crop)
    from specdec.models.sessions import graphs
    graphs.CapturedStep.__call__ = timed("captured steps", graphs.CapturedStep.__call__)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--draft-quantize", default="int8", help="int8 (default) or none")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--n-prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default=None, help="cpu (default) or cuda (the static engine, CUDA graphs)")
    parser.add_argument("--random-weights", action="store_true",
                        help="the presets' architectures with random weights (host timings only; alpha is 0)")
    parser.add_argument("--torch-profile", type=int, default=0, metavar="N",
                        help="also print the N ops with the most host time (torch.profiler), per target call")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args()

    from specdec.sweeps.pool import ModelPool
    from specdec.tasks import load_humaneval

    pool = ModelPool(args.dtype, device=args.device, random_weights=args.random_weights)
    target = pool.get(args.target)
    quantize = None if args.draft_quantize == "none" else args.draft_quantize
    draft = pool.get(args.draft, quantize)
    prompts = [target.encode(p.text) for p in load_humaneval(args.n_prompts)]
    options = dict(draft=draft, gamma=args.gamma, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                   seed=0)
    specdec.generate(target, prompts[0], **{**options, "max_new_tokens": 8})  # warm up, untimed
    instrument(target, draft)
    wall = 0.0
    tokens = calls = 0
    profiler = contextlib.nullcontext()
    if args.torch_profile:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU])  # host time: CUDA runtime calls are CPU events
    with torch.inference_mode(), profiler:
        for ids in prompts:
            t0 = time.perf_counter()
            out = specdec.generate(target, ids, **options)
            wall += time.perf_counter() - t0
            tokens += len(out.token_ids)
            calls += out.stats.target_calls
    accounted = sum(TIMES.values())
    rows = {label: TIMES[label] for label in ("target forward", "draft forward", "captured steps",
                                              "sampling and acceptance", "cache rollback")}
    rows["loop overhead"] = wall - accounted
    result = {"version": getattr(specdec, "__version__", "?"), "source": specdec.__file__, "config": vars(args),
              "wall_s": wall, "new_tokens": tokens, "target_calls": calls,
              "seconds": rows, "calls": dict(CALLS),
              "ms_per_target_call": {k: 1000 * v / calls for k, v in rows.items()}}
    print(f"specdec from {specdec.__file__}; {len(prompts)} prompts, {tokens} tokens, {calls} target calls, "
          f"{wall:.1f} s ({tokens / wall:.2f} tokens/s)")
    print("| part | seconds | share | ms per target call |\n|---|---|---|---|")
    for label, seconds in rows.items():
        print(f"| {label} | {seconds:.2f} | {seconds / wall:.1%} | {1000 * seconds / calls:.2f} |")
    if args.torch_profile:
        events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        print("\nhost time by op (torch.profiler; its own overhead inflates small ops), per target call:\n"
              "| op | calls | self host ms |\n|---|---|---|")
        for e in events[: args.torch_profile]:
            print(f"| {e.key} | {e.count / calls:.1f} | {e.self_cpu_time_total / 1000 / calls:.3f} |")
        result["host_ops_per_target_call"] = {e.key: {"calls": e.count / calls,
                                                      "self_ms": e.self_cpu_time_total / 1000 / calls}
                                              for e in events[: args.torch_profile]}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

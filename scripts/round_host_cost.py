"""The host's share of a graphed round: every round replayed as a graph that is already finished.

    python scripts/round_host_cost.py [--tokens 400]

Tiny Qwen2 models with the CUDA graph calls emulated on CPU (as the tests do), the round graphs prepared, and
each replay replaced by the static inputs' fills and the last output: what remains of ``specdec.generate`` is
the loop's own host work per target call (bookkeeping, the read-back's parsing, the schedule, stop strings,
prompt lookup's search). On a GPU this is time the device waits between two replays.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import conftest  # noqa: E402  (the emulated graphs)
from tiny import captured, load_tiny, perturbed  # noqa: E402

import specdec  # noqa: E402
from specdec import round_graph  # noqa: E402
from specdec.decoding import prepare_steps  # noqa: E402
from specdec.models.sessions import graphs

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    graphs.side_stream, graphs.capture, graphs.memory_pool = (contextlib.nullcontext, conftest.ReplayByRunningAgain.capture,
                                                              conftest.EmulatedPool)
    base = load_tiny("qwen2", eos=None)
    target, draft = captured(base), captured(perturbed(base, 0.05))
    prepare_steps(target, [draft, "prompt-lookup"], [4], len(PROMPT) + args.tokens + 1)
    round_graph.RoundGraph.replay = lambda self, *inputs: (self.set_inputs(*inputs), self.out)[1]
    round_graph.RoundGraph.replay_chained = lambda self: self.out
    print("| rounds of | stop strings | target calls | graphed | host us per call |\n|---|---|---|---|---|")
    for label, options in (("plain", {"draft": None}), ("0.5B-like model draft, gamma 4", {"draft": draft, "gamma": 4}),
                           ("prompt lookup, gamma 4", {"draft": "prompt-lookup", "gamma": 4})):
        for stop in (None, ["\ndef"]):
            specdec.generate(target, PROMPT, max_new_tokens=50, stop=stop, **options)  # warm
            t0 = time.perf_counter()
            out = specdec.generate(target, PROMPT, max_new_tokens=args.tokens, stop=stop, **options)
            seconds = time.perf_counter() - t0
            s = out.stats
            print(f"| {label} | {'yes' if stop else 'no'} | {s.target_calls} | {s.rounds_graphed} | "
                  f"{seconds / s.target_calls * 1e6:.0f} |")


if __name__ == "__main__":
    main()

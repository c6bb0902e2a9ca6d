"""Replay parameter-free drafters over recorded greedy outputs: tokens per round, proposals, and the target time
per token that a verification cost curve predicts, with no model run.

    python scripts/draft_replay.py [--records docs/results/humaneval_int8_target.json --run int8]
        [--n 164] [--max-new-tokens 128] [--verify-costs 1:1,2:1.08,5:1.35,8:1.84]
    python scripts/draft_replay.py --outputs FILE.json [--make-outputs]   # whole 128-token generations

Under greedy verification a one-hot draft's fate is decided by the target's own greedy output: a round at
position t accepts the longest prefix of the proposal that the output continues with, then the target adds
one token. So the recorded completions of a greedy run (here the exact int8 target's HumanEval completions,
re-tokenized, cut at HumanEval's stop lines), or ``--outputs`` (the ids of whole generations; ``--make-outputs``
first writes them: the exact int8 target's greedy decoding, through specdec's CPU default, which gives the same
tokens) give each drafter's exact round structure; the target's cost per round is the verification
cost of (proposal + 1) tokens, relative to a one-token step (the curve: width:cost pairs, interpolated).
The predicted speedup over plain decoding ignores the drafter's own time (microseconds) and the loop's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from specdec.drafters.prompt_lookup import find_continuation
from specdec.drafters.suffix import suffix_continuation
from specdec.tasks import load_task


def replay(sequences, propose, cost):
    """sequences: [(prompt ids, output ids)]; propose(context, k) -> ids; cost(width) -> relative target time."""
    rounds = proposed = accepted = tokens = 0
    time = 0.0
    for prompt, output in sequences:
        seq = [*prompt, *output]
        t = len(prompt)
        while t < len(seq):
            draft = propose(seq[:t], len(seq) - t - 1) if len(seq) - t > 1 else []
            n = 0
            while n < len(draft) and seq[t + n] == draft[n]:
                n += 1
            rounds, proposed, accepted = rounds + 1, proposed + len(draft), accepted + n
            time += cost(len(draft) + 1)
            t += n + 1
            tokens += n + 1
    return {"rounds": rounds, "tokens": tokens, "tokens_per_round": tokens / rounds,
            "proposed_per_round": proposed / rounds, "accepted_share": accepted / max(proposed, 1),
            "predicted_speedup": tokens / time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="docs/results/humaneval_int8_target.json")
    parser.add_argument("--run", default="int8", help="which run of the records (its completions)")
    parser.add_argument("--n", type=int, default=164)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--verify-costs", default="1:1,2:1.08,5:1.35,8:1.84")
    parser.add_argument("--gammas", default="2,3,4,6,8")
    parser.add_argument("--outputs", help="a JSON list of {prompt_ids, output_ids} (instead of --records)")
    parser.add_argument("--make-outputs", action="store_true",
                        help="first write --outputs: the first --n HumanEval prompts, --max-new-tokens greedy tokens")
    args = parser.parse_args()

    if args.make_outputs:
        import specdec
        from specdec.config import DEFAULT_TARGET, default_draft, default_target_quantize

        # what `specdec generate` runs: on a CPU the exact int8 target (its greedy tokens whatever the draft)
        target = specdec.load(DEFAULT_TARGET, quantize=default_target_quantize(DEFAULT_TARGET))
        made = []
        for item in load_task("humaneval").items[: args.n]:
            out = specdec.generate(target, item.prompt, draft=default_draft(target.device),
                                   max_new_tokens=args.max_new_tokens, temperature=0)
            made.append({"id": item.id, "prompt_ids": target.encode(item.prompt), "output_ids": out.token_ids})
        Path(args.outputs).write_text(json.dumps(made))
    if args.outputs:
        sequences = [(r["prompt_ids"], r["output_ids"][: args.max_new_tokens])
                     for r in json.loads(Path(args.outputs).read_text())[: args.n]]
    else:
        from transformers import AutoTokenizer

        from specdec.models.formats.presets import resolve_preset

        tokenizer = AutoTokenizer.from_pretrained(resolve_preset("qwen2.5-coder-1.5b", progress=False))
        rows = json.loads(Path(args.records).read_text())["runs"][args.run]["rows"][: args.n]
        prompts = {item.id: item.prompt for item in load_task("humaneval").items}
        sequences = []
        for row in rows:
            prompt = tokenizer.encode(prompts[row["task_id"]])
            output = tokenizer.encode(prompts[row["task_id"]] + row["completion"])[len(prompt):][: args.max_new_tokens]
            sequences.append((prompt, output))
    widths, costs = zip(*[tuple(float(x) for x in pair.split(":")) for pair in args.verify_costs.split(",")])
    cost = lambda w: float(np.interp(w, widths, costs, right=costs[-1] + (w - widths[-1]) * (costs[-1] - costs[-2]) / (widths[-1] - widths[-2])))
    drafters = {}
    for gamma in (int(g) for g in args.gammas.split(",")):
        drafters[f"prompt-lookup, gamma {gamma}"] = lambda c, k, g=gamma: find_continuation(c, min(k, g))
    for gamma in (int(g) for g in args.gammas.split(",")):
        drafters[f"suffix, up to {gamma}"] = lambda c, k, g=gamma: suffix_continuation(c, min(k, g))
    for factor in (1.0, 4.0):
        for p in (0.05, 0.3):
            drafters[f"suffix, up to 8, spec_factor {factor}, min_probability {p}"] = (
                lambda c, k, f=factor, p=p: suffix_continuation(c, min(k, 8), spec_factor=f, min_probability=p))
    results = {}
    print(f"{len(sequences)} completions, {sum(len(o) for _, o in sequences)} tokens; verification costs {args.verify_costs}")
    print("| drafter | tokens per round | proposed per round | accepted share | predicted speedup over plain |")
    print("|---|---|---|---|---|")
    for name, propose in drafters.items():
        r = results[name] = replay(sequences, propose, cost)
        print(f"| {name} | {r['tokens_per_round']:.2f} | {r['proposed_per_round']:.2f} | {r['accepted_share']:.3f} | "
              f"{r['predicted_speedup']:.2f}x |")
    print(json.dumps({"settings": vars(args), "results": results}))


if __name__ == "__main__":
    main()

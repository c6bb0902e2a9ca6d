"""``specdec alpha``: the acceptance rate alpha of drafts for a target on a task (paper Table 3, Table 5).

For each prompt and temperature the target generates a continuation (greedy at temperature 0,
sampled at temperature 1). Then, teacher-forced along that continuation, every draft proposes one
token at every position (``propose(prefix, 1)``, so any drafter works) and the position's
beta = sum_x min(p(x), q(x)) (Theorem 5) is recorded; alpha is the mean of beta over all positions
(Corollary 6). Conventions, as in :mod:`specdec.stats`:

- p and q are standardized the same way (Section 2.2); at temperature 0 both are one-hot, so beta is
  1 when the draft's token is the target's argmax and 0 otherwise;
- a draft without probabilities (prompt lookup) is a one-hot q on its token: beta = p(x); where it
  proposes nothing, beta = 0. Its *coverage* is the fraction of positions where it proposed a token;
- with lenience l (Appendix A.5): beta = min(1, sum_x min(p(x) / l, q(x))) when sampling, and at
  temperature 0 the token also counts as accepted when p(x) >= l * max(p).

The target's continuation can be produced speculatively (``--generate-with``, by default the first
model draft): the output follows the target's distribution exactly, so alpha is measured on the same
kind of text, in less time.

    specdec alpha --task translation --n-prompts 10 --drafts qwen2.5-coder-0.5b bigram prompt-lookup
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm import tqdm

import specdec
from specdec.acceptance import lenient_greedy_mask
from specdec.sweeps.options import (
    DEFAULT_DRAFT, DEFAULT_TARGET, DEFAULT_TASK, MAX_NEW_TOKENS, add_dtype_argument, add_json_argument,
    add_sweep_arguments, add_threads_argument, check_sweep_options, number_list, sweep_threads,
)
from specdec.sweeps.pool import ModelPool, build_draft, check_models, corpus_ids, is_model_spec, needs_corpus
from specdec.drafters import plan_draft
from specdec.analysis.values import fmt, short
from specdec.sweeps.machine import dtype_name, machine_info
from specdec.tasks import encode_item, has_chat_template, load_task, ngram_corpus
from specdec.drafters import DraftContext, make_drafter
from specdec.errors import SpecDecError
from specdec.models import LanguageModel
from specdec.sampling import SamplingParams, standardize
from specdec.sweeps import Unit, execute, plain_options, shards
from specdec.sweeps.units import flatten, loaded_for

DEFAULT_DRAFTS = (DEFAULT_DRAFT, "unigram", "bigram", "prompt-lookup", "random")
N_PROMPTS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``specdec alpha`` options."""
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target model: preset, folder or hub id")
    parser.add_argument("--drafts", nargs="+", default=list(DEFAULT_DRAFTS), metavar="SPEC",
                        help="drafts to measure: models (NAME or NAME:int8), prompt-lookup, suffix, unigram, bigram, random, "
                             "or a hierarchy 'A<-B' (default: %(default)s)")
    parser.add_argument("--task", default=DEFAULT_TASK,
                        help="humaneval, translation, summarization, jsonl:PATH, wmt:SRC,REF, cnndm:PATH")
    parser.add_argument("--n-prompts", type=int, default=N_PROMPTS, help="prompts of the task to use")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="tokens the target generates per prompt")
    parser.add_argument("--temperatures", default="0,1", help="comma list; 0 = greedy (default: 0,1)")
    parser.add_argument("--leniences", default="1", help="comma list of lenience values l in (0, 1] (Table 5 form)")
    parser.add_argument("--ngram-corpus", default="task",
                        help="unigram/bigram estimated from: 'task' (the task's held-out text), 'prompt' (the prompt "
                             "and generated text, as in generate), or a text file PATH")
    parser.add_argument("--generate-with", default="auto",
                        help="draft that speeds up the target's own generation (exact): 'auto' = the first model "
                             "draft, 'none' = plain decoding, or a draft spec")
    add_dtype_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the target's sampling (prompt i uses seed + i)")
    add_threads_argument(parser)
    add_json_argument(parser)
    add_sweep_arguments(parser, shard_help="prompts per unit of work (default 1); alpha pools over units")


def _validate(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    if args.n_prompts < 1 or args.max_new_tokens < 1:
        raise SpecDecError("--n-prompts and --max-new-tokens must be >= 1")
    temperatures = number_list(args.temperatures, float, "--temperatures", unique=False)
    leniences = number_list(args.leniences, float, "--leniences", unique=False)
    if any(t < 0 for t in temperatures):
        raise SpecDecError(f"temperatures must be >= 0, got {args.temperatures}")
    if any(not 0 < l <= 1 for l in leniences):
        raise SpecDecError(f"leniences must be in (0, 1], got {args.leniences}")
    check_sweep_options(args)
    if 1.0 not in leniences:
        leniences = [1.0, *leniences]
    for spec in args.drafts:
        plan_draft(spec)
    return temperatures, leniences


def betas_for_draft(drafter: Any, target: LanguageModel, prompt_ids: Sequence[int], start: Sequence[int],
                    generated: Sequence[int], logits: torch.Tensor, p: torch.Tensor, sampling: SamplingParams,
                    leniences: Sequence[float], seed: int) -> tuple[dict[float, list[float]], int]:
    """Teacher-forced betas of one drafter along one continuation.

    start: the target's decoding sequence before the continuation (for a causal LM, the prompt).
    generated: the continuation, n tokens; logits: [n, V] the target's logits predicting each of them;
    p: [n, V] the standardized target distributions. Returns ({l: [beta at each position]}, covered).
    """
    generator = torch.Generator().manual_seed(seed)
    eos = frozenset(target.eos_token_ids)
    source = list(prompt_ids) if target.is_encoder_decoder else ()
    drafter.start(DraftContext(list(prompt_ids), sampling, generator, target.vocab_size, eos, source))
    betas: dict[float, list[float]] = {l: [] for l in leniences}
    covered = 0
    sequence = list(start)
    target_argmax = logits.argmax(-1)  # [n]
    for j, actual in enumerate(generated):
        draft = drafter.propose(sequence, 1)
        if len(draft) == 0:
            for l in leniences:
                betas[l].append(0.0)
        else:
            covered += 1
            x = draft.tokens[:1]  # [1]
            if sampling.greedy:
                exact = float(int(x[0]) == int(target_argmax[j]))
                for l in leniences:
                    ok = exact if l == 1.0 else float(exact or bool(lenient_greedy_mask(logits[j: j + 1], x, l)[0]))
                    betas[l].append(ok)
            else:
                for l in leniences:
                    if draft.q is not None:
                        beta = float(torch.minimum(p[j] / l, draft.q[0]).sum().clamp(max=1.0))
                    else:  # one-hot q on x
                        beta = min(1.0, float(p[j, int(x[0])]) / l)
                    betas[l].append(beta)
        drafter.update(int(len(draft) > 0 and int(draft.tokens[0]) == int(actual)))
        sequence.append(int(actual))
    return betas, covered


def measure_prompt(target: LanguageModel, drafts: dict[str, Any], index: int, ident: str, ids: Sequence[int],
                   temperature: float, leniences: Sequence[float], max_new_tokens: int = MAX_NEW_TOKENS, seed: int = 0,
                   generate_with: Any = None) -> list[dict[str, Any]]:
    """The records of one prompt (the ``index``-th) at one temperature: the target's continuation (seed +
    index), then every draft's teacher-forced betas along it (plain values: they travel between processes)."""
    out = specdec.generate(target, list(ids), draft=generate_with, temperature=temperature,
                           max_new_tokens=max_new_tokens, seed=seed + index)
    generated = list(out.token_ids)
    records: list[dict[str, Any]] = [{"record": "generation", "temperature": temperature, "prompt": ident,
                                      "index": index, "prompt_tokens": len(ids), "new_tokens": len(generated),
                                      "token_ids": generated, "text": out.text}]
    if not generated:
        return records
    sampling = SamplingParams(temperature=temperature)
    session, start = target.start(list(ids))
    # row j: the logits at the position before generated[j], i.e. the target's prediction of it
    logits = session.logits_of(list(start) + generated[:-1], len(generated)).float()  # [n, V]
    p = standardize(logits, sampling)  # [n, V]
    for label, draft in drafts.items():
        drafter = make_drafter(draft, target)
        with torch.inference_mode():
            betas, cov = betas_for_draft(drafter, target, ids, start, generated, logits, p, sampling, leniences,
                                         seed + index)
        records.append({"record": "betas", "draft": label, "temperature": temperature, "prompt": ident,
                        "index": index, "covered": cov, "betas": {str(l): b for l, b in betas.items()}})
    return records


def aggregate(records: Sequence[dict[str, Any]], drafts: Sequence[str], temperatures: Sequence[float],
              leniences: Sequence[float]) -> tuple[list[dict], list[dict]]:
    """(one result per draft and temperature, the generations) from the records of every prompt, in the
    order of the prompts: the same numbers whichever processes or machines produced the records."""
    sums: dict[tuple[str, float], dict[str, list[float]]] = {}
    covered: dict[tuple[str, float], int] = {}
    per_prompt: dict[tuple[str, float], list[float]] = {}
    generations = []
    for r in sorted(records, key=lambda r: (temperatures.index(r["temperature"]), r["index"])):
        if r["record"] == "generation":
            generations.append({k: v for k, v in r.items() if k not in ("record", "index")})
            continue
        key = (r["draft"], r["temperature"])
        acc = sums.setdefault(key, {str(l): [] for l in leniences})
        for l in leniences:
            acc[str(l)].extend(r["betas"][str(l)])
        covered[key] = covered.get(key, 0) + r["covered"]
        first = r["betas"]["1.0"]
        per_prompt.setdefault(key, []).append(sum(first) / len(first))
    results = []
    for label in drafts:
        for temperature in temperatures:
            key = (label, temperature)
            acc = sums.get(key)
            n = len(acc["1.0"]) if acc else 0
            alpha = sum(acc["1.0"]) / n if n else None
            beta_sq = sum(b * b for b in acc["1.0"]) / n if n else None
            results.append({
                "draft": label,
                "kind": _kind(label),
                "temperature": temperature,
                "alpha": alpha,
                "alpha_by_lenience": {str(l): (sum(acc[str(l)]) / n if n else None) for l in leniences},
                "positions": n,
                "coverage": covered.get(key, 0) / n if n else None,
                "alpha_where_proposed": (sum(acc["1.0"]) / covered[key]) if n and covered.get(key) else None,
                # standard error of the mean over positions (positions of one text are not independent)
                "stderr": math.sqrt(max(0.0, beta_sq - alpha * alpha) / n) if n else None,
                "per_prompt": per_prompt.get(key, []),
            })
    return results, generations


def measure(target: LanguageModel, drafts: dict[str, Any], prompts: Sequence[tuple[str, Sequence[int]]],
            temperatures: Sequence[float], leniences: Sequence[float] = (1.0,), max_new_tokens: int = MAX_NEW_TOKENS,
            seed: int = 0, generate_with: Any = None, progress: bool = False) -> tuple[list[dict], list[dict]]:
    """alpha of every draft (label -> anything ``specdec.generate(draft=...)`` takes) along the target's own
    continuations of ``prompts`` ((id, token ids) pairs). Returns (one result per draft and temperature,
    the generations). ``generate_with``: a draft that speeds up the target's generation (exact)."""
    leniences = [float(l) for l in leniences]
    leniences = leniences if 1.0 in leniences else [1.0, *leniences]
    records = []
    for temperature in tqdm(temperatures, desc="alpha", file=sys.stderr, disable=not progress):
        for i, (ident, ids) in enumerate(prompts):
            records += measure_prompt(target, drafts, i, ident, ids, temperature, leniences, max_new_tokens, seed,
                                      generate_with)
    return aggregate(records, list(drafts), list(temperatures), leniences)


@dataclass
class _Loaded:
    """What every unit of one alpha sweep shares: the task, the models and the drafts, loaded once."""

    task: Any
    target: LanguageModel
    drafts: dict[str, Any]
    gen_spec: str | None
    gen_draft: Any
    prompts: list[tuple[str, list[int]]]
    corpus_source: str
    corpus_tokens: int


def _load(args: argparse.Namespace, target: LanguageModel | None = None, pool: ModelPool | None = None) -> _Loaded:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    task = load_task(args.task, args.n_prompts)
    pool = pool if pool is not None else ModelPool(args.dtype)
    check_models(pool, None if target is not None else (args.target, None), args.drafts)
    target = target if target is not None else pool.get(args.target)
    corpus_text, corpus_source = ngram_corpus(args.ngram_corpus, task)
    ids_corpus = corpus_ids(corpus_text, target) if needs_corpus(args.drafts) else None
    drafts = {spec: build_draft(spec, pool, ids_corpus) for spec in args.drafts}
    if args.generate_with == "auto":
        gen_spec = next((s for s in args.drafts if is_model_spec(s)), None)
    else:
        gen_spec = None if args.generate_with == "none" else args.generate_with
    gen_draft = None if gen_spec is None else (drafts[gen_spec] if gen_spec in drafts else build_draft(gen_spec, pool))
    prompts = [(item.id, encode_item(target, item)) for item in task.items]
    return _Loaded(task, target, drafts, gen_spec, gen_draft, prompts, corpus_source, len(ids_corpus or ()))


def _run(loaded: _Loaded, args: argparse.Namespace, unit: Unit) -> list[dict[str, Any]]:
    _, leniences = _validate(args)
    records = []
    for i in unit.prompts:
        ident, ids = loaded.prompts[i]
        records += measure_prompt(loaded.target, loaded.drafts, i, ident, ids, unit.temperature, leniences,
                                  args.max_new_tokens, args.seed, loaded.gen_draft)
    return records


def run_unit(unit: Unit) -> list[dict[str, Any]]:
    """One unit (one temperature x a shard of prompts) from its options alone: what a Ray worker runs."""
    return _run(loaded_for(unit, _load), argparse.Namespace(**unit.options), unit)


def plan(args: argparse.Namespace, n_prompts: int) -> list[Unit]:
    """The units of an alpha sweep: every temperature x every shard of ``--shard-size`` prompts."""
    temperatures, _ = _validate(args)
    options = plain_options(args)
    return [Unit("alpha", "prompts", options, t, shard) for t in temperatures
            for shard in shards(n_prompts, 1 if args.shard_size is None else args.shard_size)]


def run(args: argparse.Namespace, *, target: LanguageModel | None = None, pool: ModelPool | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Measure alpha for every draft of ``args.drafts``; returns the JSON-able document.

    target / pool: models already loaded (tests inject tiny ones); by default loaded from the names.
    With ``args.ray`` the units run as Ray tasks, each loading the models from the names.
    """
    temperatures, leniences = _validate(args)
    ray = getattr(args, "ray", None)
    if ray is not None and (target is not None or pool is not None):
        raise SpecDecError("--ray loads the models by name in every worker: give names, not loaded models")
    if ray is not None:
        args.threads = sweep_threads(args.threads)
    loaded = _load(args, target, pool)
    units = plan(args, len(loaded.prompts))
    t_start = time.perf_counter()
    parts = execute(units, lambda unit: _run(loaded, args, unit), ray=ray, num_cpus=args.threads or 1,
                    records=getattr(args, "records", None), progress=progress)
    results, generations = aggregate(flatten(parts), list(loaded.drafts), temperatures, leniences)
    target = loaded.target
    return {
        "command": "specdec alpha",
        "config": {
            "target": target.name,
            "task": loaded.task.name,
            "task_source": loaded.task.source,
            "chat_template": any(i.chat for i in loaded.task.items) and has_chat_template(target),
            "n_prompts": len(loaded.prompts),
            "max_new_tokens": args.max_new_tokens,
            "temperatures": temperatures,
            "leniences": leniences,
            "drafts": list(loaded.drafts),
            "ngram_corpus": loaded.corpus_source,
            "ngram_corpus_tokens": loaded.corpus_tokens,
            "generated_with": loaded.gen_spec or "plain decoding",
            "dtype": dtype_name(target.dtype),
            "seed": args.seed,
            "units": len(units),
            "ran_on": f"Ray ({ray})" if ray is not None else "this process",
        },
        "machine": machine_info(dtype_name(target.dtype)),
        "seconds": time.perf_counter() - t_start,
        "results": results,
        "generations": generations,
    }


def _kind(spec: str) -> str:
    try:
        levels = plan_draft(spec).levels
    except SpecDecError:
        return "custom"
    if len(levels) > 1:
        return "hierarchy"
    return levels[0][0] if levels[0][0] in ("unigram", "bigram", "prompt-lookup", "random") else "model"


def _sampling(temperature: float) -> str:
    return "t=0 (argmax)" if temperature == 0 else f"t={short(temperature)}"


def table(document: dict[str, Any]) -> str:
    """Markdown in the paper's Table 3 form, then Table 5 (alpha vs lenience) when leniences were given."""
    cfg = document["config"]
    lines = ["| M_p | M_q | task | sampling | alpha | ± s.e. | n (positions) | prompts | coverage |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in document["results"]:
        lines.append(f"| {cfg['target']} | {r['draft']} | {cfg['task']} | {_sampling(r['temperature'])} | "
                     f"{fmt(r['alpha'], '.3f')} | {fmt(r['stderr'], '.3f')} | {r['positions']} | {len(r['per_prompt'])} | "
                     f"{fmt(r['coverage'], '.2f')} |")
    leniences = [l for l in cfg["leniences"]]
    if len(leniences) > 1:
        lines += ["", "alpha vs lenience l (paper Table 5 form; l < 1 is not exact):", "",
                  "| M_q | sampling | " + " | ".join(f"l={l:g}" for l in leniences) + " |",
                  "|---|---|" + "---|" * len(leniences)]
        for r in document["results"]:
            lines.append(f"| {r['draft']} | {_sampling(r['temperature'])} | "
                         + " | ".join(fmt(r["alpha_by_lenience"][str(l)], ".3f") for l in leniences) + " |")
    lines += ["", f"{cfg['n_prompts']} prompts of {cfg['task']} ({cfg['task_source']}), up to {cfg['max_new_tokens']} "
              f"tokens each generated by the target ("
              + (cfg['generated_with'] if cfg['generated_with'] == "plain decoding"
                 else f"speculative decoding with {cfg['generated_with']}, which leaves its output exact")
              + f"), {cfg['dtype']}; unigram/bigram "
              f"estimated from {cfg['ngram_corpus']} ({cfg['ngram_corpus_tokens']} tokens). Coverage: fraction of "
              "positions where the draft proposed a token (beta = 0 elsewhere)."]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run, print the table, then the JSON document (last on stdout)."""
    document = run(args)
    text = json.dumps(document, indent=2)
    if args.json:
        Path(args.json).expanduser().write_text(text + "\n", encoding="utf-8")
    print(table(document))
    print()
    print(text, flush=True)
    return 0

"""The options of ``specdec bench``.

Defaults are declared once: the models in :mod:`specdec.models.formats.catalog`, gamma and temperature in
:class:`specdec.config.GenerationConfig`, what every measuring command shares in
:mod:`specdec.sweeps.options`, the rest here.
"""

from __future__ import annotations

import argparse

from specdec.bench.methods import METHODS
from specdec.config import GenerationConfig
from specdec.errors import SpecDecError
from specdec.schedules import SCHEDULES
from specdec.sweeps.options import (
    DEFAULT_DRAFT, DEFAULT_TARGET, DEFAULT_TASK, MAX_NEW_TOKENS, add_dtype_argument, add_json_argument,
    add_sweep_arguments, add_threads_argument, check_sweep_options, number_list,
)

__all__ = ["DEFAULT_GAMMA", "add_arguments", "validate"]

DEFAULT_GAMMA = GenerationConfig.gamma
DEFAULT_TEMPERATURE = GenerationConfig.temperature
N_PROMPTS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bench options to ``parser``."""
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target model: preset, folder or hub id")
    parser.add_argument("--draft", default=DEFAULT_DRAFT,
                        help="draft model, or a drafter name (prompt-lookup, suffix, unigram, bigram, random)")
    parser.add_argument("--drafts", nargs="+", default=None, metavar="SPEC",
                        help="several drafts (replaces --draft; the first is the primary one): NAME, NAME:int8, "
                             "prompt-lookup, suffix, unigram, bigram, random, or a hierarchy 'A<-B' (quote it)")
    parser.add_argument("--gamma", type=int, default=DEFAULT_GAMMA,
                        help="draft tokens per target call (constant); also the start of the varying schedules and "
                             "the gamma of transformers' assisted generation and of lenience runs")
    parser.add_argument("--gammas", default=None, help="comma list of constant gammas to run (default: --gamma)")
    parser.add_argument("--batch-sizes", default=None, metavar="B,...",
                        help="comma list of batch sizes: also run every prompt through the batch engine at most B rows "
                             "at once, plain and with each draft at each constant gamma (Theorem 8 per B)")
    parser.add_argument("--gamma-schedules", default="constant",
                        help=f"comma list out of {', '.join(SCHEDULES)}; 'constant' runs every --gammas value, the "
                             "others start at --gamma (default: constant)")
    parser.add_argument("--verifications", default="token",
                        help="comma list out of token, block; block adds a run of every draft at --gamma (block "
                             "verification, Sun et al. 2025: exact, never fewer accepted tokens in expectation)")
    parser.add_argument("--leniences", default="1",
                        help="comma list of lenience values; each l < 1 adds a run at --gamma (NOT exact, Appendix A.5)")
    parser.add_argument("--task", default=DEFAULT_TASK,
                        help="humaneval, translation, summarization, jsonl:PATH, wmt:SRC,REF (or wmt:FILE.tsv), "
                             "cnndm:PATH (see specdec.tasks)")
    parser.add_argument("--n-prompts", type=int, default=N_PROMPTS, help="how many prompts to run")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="new tokens per prompt (at most)")
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, help="0 = greedy")
    parser.add_argument("--temperatures", default=None, help="comma list, e.g. 0,1 (default: --temperature)")
    parser.add_argument("--ngram-corpus", default="task",
                        help="unigram/bigram drafts estimated from 'task' (held-out text of the task), 'prompt' "
                             "(the prompt and generated text), or a text file PATH")
    add_dtype_argument(parser)
    parser.add_argument("--quantize", default=None, metavar="METHOD",
                        help="quantize the TARGET (int8, int8-tensor, int4-mixed or int4: block-invariant models); every method "
                             "then runs the quantized target, and speculative output equals its plain decoding")
    parser.add_argument("--methods", default=None,
                        help=f"comma list out of: {', '.join(METHODS)} (default: all; llama-cpp only when "
                             "llama-cpp-python is installed and the target is a preset or a .gguf file)")
    parser.add_argument("--hf-assisted-drafts", nargs="+", default=None, metavar="SPEC",
                        help="drafts for transformers' assisted generation (default: the model drafts of --drafts), "
                             "e.g. its usual bf16 assistant while specdec runs an int8 one")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every method on every prompt")
    parser.add_argument("--warmup", type=int, default=1, help="prompts every configuration runs untimed first")
    parser.add_argument("--prompts-file", default=None,
                        help="JSONL file with a \"prompt\" field (same as --task jsonl:PATH)")
    add_json_argument(parser)
    parser.add_argument("--out", default=None, metavar="DIR", help="write bench.json, bench.csv and bench.md into DIR, and runs.jsonl as each prompt ends")
    add_threads_argument(parser)
    add_sweep_arguments(parser, shard_help="prompts per unit of work (default: all, one unit per temperature); "
                                           "timings compare within a unit")
    parser.add_argument("--seed", type=int, default=0, help="seed of every generation (sampling only)")
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when available), cpu, cuda or cuda:N: every model and method runs there")
    parser.add_argument("--random-weights", action="store_true",
                        help="build each preset's exact architecture with random weights (timings only, no weight "
                             "files needed; byte-level stand-in tokenizer; alpha is meaningless): see "
                             "specdec.models.random_weights")
    parser.add_argument("--compile", action="store_true",
                        help="CUDA: compile specdec's captured steps with inductor (about a minute per step width "
                             "and model at start-up; faster steps)")


def validate(args: argparse.Namespace) -> None:
    """The bench options' single-value checks (the lists are checked where the grid is built)."""
    for name in ("gamma", "n_prompts", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise SpecDecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise SpecDecError(f"--warmup must be >= 0, got {args.warmup}")
    if args.temperature < 0:
        raise SpecDecError(f"--temperature must be >= 0, got {args.temperature}")
    if args.threads is not None and args.threads < 1:
        raise SpecDecError(f"--threads must be >= 1, got {args.threads}")
    check_sweep_options(args)
    if getattr(args, "batch_sizes", None) and any(b < 1 for b in number_list(args.batch_sizes, int, "--batch-sizes")):
        raise SpecDecError(f"--batch-sizes must be >= 1, got {args.batch_sizes}")

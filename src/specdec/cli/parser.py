"""The ``specdec`` command's parser: every subcommand and its options (:mod:`specdec.cli` runs them).

Generation options default to None here, so the only defaults are those of
:class:`specdec.config.GenerationConfig`.
"""

from __future__ import annotations

import argparse
import os

from specdec.config import (
    DEFAULT_DRAFT,
    DEFAULT_DRAFT_INNER_CPU,
    DEFAULT_DRAFT_QUANTIZE_CPU,
    DEFAULT_DRAFT_QUANTIZE_KERNELS,
    DEFAULT_DRAFT_VOCABULARY_KERNELS,
    DEFAULT_TARGET,
)
from specdec.drafters.spec import COPY_FIRST

SERVED_POSITIONS = 4096  # the served caches' capacity (specdec serve --max-positions)
SERVED_BATCH_CPU = 8  # specdec serve --max-batch on CPU (docs/serving.md: the load test)
SERVED_PREFIX_CACHE_MB = 1024  # specdec serve --prefix-cache: about 18,000 positions of the 1.5B and its 0.5B draft


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """The models and how they speculate: shared by generate and serve."""
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model: preset, folder, hub id or .gguf (default {DEFAULT_TARGET})")
    p.add_argument("--draft", action="append", default=None, metavar="SPEC",
                   help="the draft, in the one draft syntax: a model (preset, folder, hub id, .gguf) with an optional "
                        ":int8, :int8-tensor or :int4, or prompt-lookup, bigram, unigram, random; A<-B for hierarchical "
                        "drafting (B drafts for A; repeating --draft appends levels the same way); copy+A<-B: copying first (where "
                        "the text repeats, a copy of the context goes to the target directly); 'none' for plain "
                        f"decoding (default on CPU: {COPY_FIRST}{DEFAULT_DRAFT}:{DEFAULT_DRAFT_QUANTIZE_KERNELS}@"
                        f"{DEFAULT_DRAFT_VOCABULARY_KERNELS}<-{DEFAULT_DRAFT_INNER_CPU} where it has AVX-512 VNNI or AVX2, "
                        f"else {COPY_FIRST}{DEFAULT_DRAFT}:{DEFAULT_DRAFT_QUANTIZE_CPU}<-{DEFAULT_DRAFT_INNER_CPU}; "
                        f"{DEFAULT_DRAFT} on CUDA)")
    p.add_argument("--dtype", default=None,
                   help="model dtype of float models: bf16 (default) or fp32 (exact comparisons); asking one keeps the "
                        "packaged target in that dtype instead of the CPU's quantized default (--quantize)")
    p.add_argument("--draft-quantize", default=None, metavar="METHOD",
                   help="int8, int8-tensor or int4 for every model level of --draft that names no quantization of its own "
                        "(the same as writing :METHOD after it); never changes the output")
    p.add_argument("--device", default=None,
                   help="auto (default: CUDA when available, else CPU), cpu, cuda or cuda:N; target and draft run there")
    p.add_argument("--compile", action="store_true", default=None,
                   help="CUDA: compile the captured decoding steps with inductor (about a minute per step width and "
                        "model at start-up, then faster steps; worth it for long runs and servers)")
    p.add_argument("--quantize", default=None, metavar="METHOD",
                   help="quantize the TARGET (CPU): int8 (or int8-tensor), int4-mixed (a preset GGUF's Q4_K tensors "
                        "in int4 exactly, the rest int8; AVX-512 VNNI or AVX2 CPUs) or int4: a block-invariant model, so "
                        "speculative decoding with it is exact (its output equals the quantized model's own plain "
                        "decoding); a different model from the float one (docs/int8_target.md, docs/int4.md have "
                        "their quality). Default for the packaged target on CPU without --dtype: int4-mixed where "
                        "the CPU has AVX-512 VNNI, int4 on AVX2 without it, else int8; 'none' keeps it in bf16")
    p.add_argument("--gamma", type=int, default=None,
                   help="draft tokens per target call (default: 4, constant; the default draft 2 on a CPU where "
                        "specdec's kernels run their AVX2 code)")
    p.add_argument("--gamma-schedule", default=None, choices=["constant", "heuristic", "adaptive", "confidence"],
                   help="how gamma varies (all exact): constant, heuristic (+2/-1), adaptive (Theorem 8 with running "
                        "alpha, c and verification cost), confidence (the draft stops when unsure); default: constant")
    p.add_argument("--max-gamma", type=int, default=None, help="upper bound for the varying schedules (default max(12, gamma))")
    p.add_argument("--confidence", type=float, default=None, help="threshold of the confidence schedule (default 0.5)")


def _add_generation_options(p: argparse.ArgumentParser) -> None:
    _add_model_options(p)
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens to generate at most (default 128)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh, reported in the stats)")
    p.add_argument("--chat", action="store_true", default=None, help="wrap the prompt in the model's chat template")
    p.add_argument("--num-beams", type=int, default=None, help="beam width w (> 1: beam search, greedy)")
    p.add_argument("--draft-beams", type=int, default=None, help="draft beam width u >= w (exact speculative beam search)")
    p.add_argument("--beam-mode", default=None, choices=["exact", "report"],
                   help="exact (paper A.4, identical to plain beam search) or report (approximate Algorithm 2)")
    p.add_argument("--length-penalty", type=float, default=None, help="beam search length penalty (default 1.0)")
    p.add_argument("--verification", default=None, choices=["token", "block"],
                   help="token (Algorithm 1, the default) or block (Sun et al. 2025: the drafted block verified as a "
                        "whole; exact too, never fewer accepted tokens in expectation; the same as token at "
                        "temperature 0 and for drafts without probabilities)")
    p.add_argument("--lenience", type=float, default=None,
                   help="paper A.5: l in (0, 1]; below 1 trades exactness for speed (default 1 = exact)")


def _add_prediction_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prediction", metavar="FILE", default=None,
                   help="Predicted Outputs: a file holding the text the output is expected to repeat (the code being "
                        "edited; '-': standard input), drafted wherever the output follows it; exact like any draft")


def _add_constraint_options(p: argparse.ArgumentParser) -> None:
    """Structured output (specdec.constraints): one of the three; exact under speculation."""
    group = p.add_argument_group("structured output (one of)")
    group.add_argument("--json-schema", metavar="FILE", default=None,
                       help="the output is JSON that satisfies the JSON schema in FILE (one line, json.dumps layout)")
    group.add_argument("--regex", metavar="PATTERN", default=None, help="the whole output matches this regular expression")
    group.add_argument("--grammar", metavar="FILE", default=None,
                       help="the output derives from the Lark grammar in FILE (llguidance's syntax; docs/structured_output.md)")
    group.add_argument("--no-forced-drafts", dest="forced_drafts", action="store_false", default=None,
                       help="do not propose the tokens the grammar forces as a draft (they are by default, with a draft)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023) for transformer models.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text, speculatively, with statistics")
    gen.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    _add_generation_options(gen)
    _add_constraint_options(gen)
    _add_prediction_option(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON document (text, token_ids, stats) instead of streaming")
    gen.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                     help="colour tokens by origin: green = accepted from the draft, blue = produced by the target")
    gen.add_argument("--verbose", "-v", action="store_true",
                     help="also print how long loading each model took and the peak memory (standard error)")

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server: completions, chat, streaming, statistics")
    _add_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY") or None,
                       help="require 'Authorization: Bearer KEY' (default: $SPECDEC_API_KEY, else no key)")
    serve.add_argument("--max-queue", type=int, default=16,
                       help="requests that may wait behind the running one; more get 429 (default 16)")
    serve.add_argument("--max-batch", type=int, default=None,
                       help="requests decoded together, as rows of one batch (continuous batching: a request joins "
                            "between rounds); 1: one at a time, through captured CUDA graphs on a GPU (default: "
                            f"{SERVED_BATCH_CPU} on CPU, measured; 1 on CUDA)")
    serve.add_argument("--max-positions", type=int, default=SERVED_POSITIONS,
                       help="with CUDA graphs: the positions (prompt + max_tokens) every request's cache holds, fixed "
                            "when the server starts, when every step is captured; a longer request runs eagerly "
                            f"(default {SERVED_POSITIONS}; attention reads the whole cache, so more costs every step)")
    serve.add_argument("--prefix-cache", type=float, default=SERVED_PREFIX_CACHE_MB, metavar="MB",
                       help="with --max-batch > 1: MB of finished requests' keys and values kept for later requests "
                            "that begin the same way (a conversation's next turn, a shared system prompt, a file sent "
                            "again), least recently used out first; the exact quantized targets only (bit for bit a "
                            f"fresh prefill); 0: none (default {SERVED_PREFIX_CACHE_MB:g})")
    serve.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                       help="with --max-batch > 1: a prompt joining running requests goes in N tokens a round, so a "
                            "long one stalls them by one chunk, not its whole prefill (the exact quantized targets "
                            "only: the same bits as one pass); 0: in one pass (default 128)")
    serve.add_argument("--batch-speculation", choices=["measured", "gate", "rows"], default="measured",
                       help="with --max-batch > 1: how many tokens the draft model drafts while two or more requests "
                            "run: measured (at most the gamma Theorem 8 gives for the batch's measured pass and draft "
                            "times: fewer, or none, as requests are added), gate (drafting or plain rounds, whichever "
                            "measured faster at that batch size), rows (each request's own gamma, every round: a "
                            "seeded sampled request then draws what it draws alone) (default measured)")
    serve.add_argument("--timeout", type=float, default=600.0,
                       help="seconds a request may take, queue included; a request may ask for less (default 600)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--no-ui", dest="ui", action="store_false",
                       help="do not serve the playground page at / (the API only)")

    bench = sub.add_parser("bench", help="benchmark plain vs speculative decoding vs transformers' own generate")
    from specdec import bench as bench_module

    bench_module.add_arguments(bench)

    sub.add_parser("presets", help="list the packaged model presets")

    from specdec import alpha as alpha_module
    from specdec.publish import plots as plot_module, results as results_module

    alpha = sub.add_parser("alpha", help="measure the acceptance rate alpha of drafts for a target (paper Table 3)")
    alpha_module.add_arguments(alpha)
    plot = sub.add_parser("plot", help="the paper's figures as PNGs, and speedup vs gamma of a bench run")
    plot_module.add_arguments(plot)
    results = sub.add_parser("results", help="regenerate docs/RESULTS.md: alpha, speed, schedules, beam search, figures")
    results_module.add_arguments(results)
    return parser

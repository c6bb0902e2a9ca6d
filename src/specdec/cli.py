"""The ``specdec`` command: a thin layer that parses, calls the library and prints.

Generation options default to None here, so the only defaults are those of
:class:`specdec.config.GenerationConfig`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

from specdec.config import DEFAULT_TARGET, INT8_DRAFT_GAMMA

SERVED_POSITIONS = 4096  # the served caches' capacity (specdec serve --max-positions)
SERVED_BATCH_CPU = 8  # specdec serve --max-batch on CPU (README: the load test)

# ANSI colours for --color: tokens accepted from the draft vs tokens produced by the target (paper Figure 1).
COLOUR_DRAFT = "\033[32m"  # green
COLOUR_TARGET = "\033[1;34m"  # bold blue
COLOUR_RESET = "\033[0m"


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """The models and how they speculate: shared by generate and serve."""
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model: preset, folder, hub id or .gguf (default {DEFAULT_TARGET})")
    p.add_argument("--draft", action="append", default=None, metavar="SPEC",
                   help="the draft, in the one draft syntax: a model (preset, folder, hub id, .gguf) with an optional "
                        ":int8 or :int8-tensor, or prompt-lookup, bigram, unigram, random; A<-B for hierarchical "
                        "drafting (B drafts for A; repeating --draft appends levels the same way); 'none' for plain "
                        "decoding (default: qwen2.5-coder-0.5b:int8<-prompt-lookup on CPU, qwen2.5-coder-0.5b on CUDA)")
    p.add_argument("--dtype", default=None, help="model dtype: bf16 (default, fast on CPU) or fp32 (exact comparisons)")
    p.add_argument("--draft-quantize", default=None, metavar="METHOD",
                   help="int8 or int8-tensor for every model level of --draft that names no quantization of its own "
                        "(the same as writing :METHOD after it); never changes the output")
    p.add_argument("--device", default=None,
                   help="auto (default: CUDA when available, else CPU), cpu, cuda or cuda:N; target and draft run there")
    p.add_argument("--compile", action="store_true", default=None,
                   help="CUDA: compile the captured decoding steps with inductor (about a minute per step width and "
                        "model at start-up, then faster steps; worth it for long runs and servers)")
    p.add_argument("--quantize", default=None, metavar="METHOD",
                   help="quantize the TARGET: int8 (or int8-tensor), a block-invariant int8 model (CPU): about twice "
                        "as fast as bf16 where bf16 is slow, and speculative decoding with it is exact (its output "
                        "equals the int8 model's own plain decoding); a different model from the original (README, "
                        "'The int8 target', has its quality). Default: int8 for the packaged target on CPU without "
                        "--dtype; 'none' keeps it in bf16")
    p.add_argument("--gamma", type=int, default=None,
                   help=f"draft tokens per target call (default: 4, constant; with one int8 model draft alone, start "
                        f"at {INT8_DRAFT_GAMMA} and adapt)")
    p.add_argument("--gamma-schedule", default=None, choices=["constant", "heuristic", "adaptive", "confidence"],
                   help="how gamma varies (all exact): constant, heuristic (+2/-1), adaptive (Theorem 8 with running "
                        "alpha, c and verification cost; the default with one int8 model draft unless --gamma is "
                        "given), confidence (the draft stops when unsure)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023) for transformer models.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text, speculatively, with statistics")
    gen.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    _add_generation_options(gen)
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


class _Streamer:
    """Prints generated text as tokens are accepted, optionally coloured by origin.

    Each token's text comes from an incremental decoder (specdec.text): the cost per token does not grow
    with the length of the output."""

    def __init__(self, model, colour: bool):
        from specdec.text import IncrementalDecoder

        self.colour = colour
        self.decoder = IncrementalDecoder(model.decode)
        self.pieces: list[str] = []

    @property
    def printed(self) -> str:
        return "".join(self.pieces)

    def __call__(self, tokens: list[int], from_draft: list[bool]) -> None:
        for token, drafted in zip(tokens, from_draft):
            piece = self.decoder.push([token])  # '' while a multi-byte character is incomplete
            self.pieces.append(piece)
            if self.colour and piece:
                piece = (COLOUR_DRAFT if drafted else COLOUR_TARGET) + piece + COLOUR_RESET
            sys.stdout.write(piece)
        sys.stdout.flush()


def draft_spec(args: argparse.Namespace) -> str:
    """--draft (levels of repeated options joined as a hierarchy) with --draft-quantize applied, or the
    default draft ('none' for plain decoding). Without --draft, --draft-quantize quantizes the default
    draft model (none: unquantized); without either, the device's default draft."""
    from specdec.config import DEFAULT_DRAFT, default_draft
    from specdec.drafters.spec import PLAIN, is_plain, join_levels, with_default_quantization
    from specdec.models.quantize import check_method

    method = args.draft_quantize
    method = None if method is None or str(method).lower() == "none" else method
    if method is not None:
        check_method(method)
    if args.draft:
        spec = join_levels(args.draft)
    else:
        batched = (getattr(args, "max_batch", None) or 1) > 1  # specdec serve's batch engine: one draft model
        spec = default_draft(args.device, batched) if args.draft_quantize is None else DEFAULT_DRAFT
    if is_plain(spec):
        return PLAIN
    return with_default_quantization(spec, method)


def _target_quantization(args: argparse.Namespace) -> str | None:
    """--quantize: 'none' leaves the target as it is; not given, the default (:func:`specdec.config.
    default_target_quantize`: the packaged target in int8 on CPU)."""
    from specdec.config import default_target_quantize
    from specdec.errors import SpecDecError

    if args.quantize is None:
        return default_target_quantize(args.target, args.device, args.dtype)
    method = None if str(args.quantize).lower() == "none" else args.quantize
    if method == "llama-cpp":
        raise SpecDecError("--quantize llama-cpp: llama.cpp runs drafts only (its multi-token passes are not "
                           "block-invariant); use --quantize int8 for the target and :llama-cpp on a --draft level")
    return method


def _check_models(args: argparse.Namespace) -> None:
    """Every check on --target, --draft, --dtype, --quantize, --draft-quantize, --device and --compile
    that loading would make, made before any model loads (a 1.5B target takes seconds to load): unknown
    names, missing files, a file where a folder is expected, unknown dtypes and quantization methods,
    int8 off the CPU, a hierarchy with a parameter-free drafter above a model."""
    from specdec.devices import resolve_device
    from specdec.drafters import plan_draft
    from specdec.errors import SpecDecError
    from specdec.models import check_load

    if args.compile and resolve_device(args.device).type != "cuda":
        raise SpecDecError("--compile compiles the captured CUDA-graph steps: it needs a CUDA device "
                           "(--device cuda); drop --compile on CPU")
    check_load(args.target, dtype=args.dtype, quantize=_target_quantization(args), device=args.device)
    plan_draft(draft_spec(args)).check(dtype=args.dtype, device=args.device)


def load_models(args: argparse.Namespace, target_tokenizer: Any = None):
    """(target, draft) as --target, --draft, --dtype, --quantize, --draft-quantize and --device say;
    ``target_tokenizer``: the target's tokenizer when it was already read (by check_prompt).

    The draft loads first, on the device and in the dtype the target will have: an int8 draft packs its
    weights on background threads (specdec.models.quantize), which then overlaps the target's load. Both
    are ready when this returns; each model's ``load_seconds`` says how long its own load took."""
    import specdec
    from specdec.devices import resolve_device
    from specdec.drafters import plan_draft
    from specdec.models import load_dtype
    from specdec.models.quantize import wait_packed

    quantize = _target_quantization(args)
    draft = plan_draft(draft_spec(args)).load(dtype=args.dtype if args.dtype is not None else load_dtype(None, quantize),
                                              device=resolve_device(args.device), compile=bool(args.compile)).draft
    target = specdec.load(args.target, dtype=args.dtype, quantize=quantize, device=args.device,
                          compile=bool(args.compile), tokenizer=target_tokenizer)
    for level in draft if isinstance(draft, list) else [draft]:
        if hasattr(level, "hf_model"):
            wait_packed(level.hf_model)
    return target, draft


def prepare_served_steps(target: Any, draft: Any, max_positions: int | None = None) -> None:
    """Fix the capture plan of the served models before the server is ready (:func:`specdec.decoding.prepare_steps`):
    caches of ``max_positions`` positions, and the steps of the widest gamma a graph can verify (every width
    bucket of the target: a request may ask for any gamma) captured and, with ``compile``, compiled, so that
    no request captures anything; greedy rounds of gamma 1 to 8 (and plain decoding's step) are captured whole
    too (:mod:`specdec.round_graph`)."""
    from specdec.decoding import prepare_steps
    from specdec.models.graphs import MAX_GRAPH_WIDTH

    prepare_steps(target, [draft] if draft is not None else [], [*range(1, 9), MAX_GRAPH_WIDTH - 1], max_positions)


def draft_label(draft) -> str:
    if draft is None:
        return "none"
    return " <- ".join(getattr(d, "name", str(d)) for d in (draft if isinstance(draft, list) else [draft]))


def _generate(args: argparse.Namespace) -> int:
    import specdec

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    config = specdec.GenerationConfig.for_draft(
        draft_spec(args), gamma=args.gamma, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, stop=args.stop, seed=args.seed, chat=args.chat,
        gamma_schedule=args.gamma_schedule, max_gamma=args.max_gamma, confidence=args.confidence,
        lenience=args.lenience, verification=args.verification, num_beams=args.num_beams,
        draft_beams=args.draft_beams, beam_mode=args.beam_mode,
        length_penalty=args.length_penalty,
    )
    if not prompt.strip():
        raise specdec.SpecDecError("the prompt is empty; give some text to continue"
                                   + (" (standard input was empty)" if args.prompt == "-" else ""))
    _check_models(args)  # everything is checked before the first model loads
    from specdec.models import check_prompt

    tokenizer = check_prompt(args.target, prompt, chat=args.chat)  # the target loads with it (not read twice)
    started = time.perf_counter()
    target, draft = load_models(args, tokenizer)
    if args.verbose:
        _print_load(target, draft, time.perf_counter() - started)
    if args.json:
        out = specdec.generate(target, prompt, draft=draft, config=config)
        print(json.dumps(out.to_dict(), indent=2))
        return 0
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    streamer = _Streamer(target, colour)
    out = specdec.generate(target, prompt, draft=draft, config=config, on_tokens=streamer)
    if out.text != streamer.printed:  # a stop string cut the text: show where it ends
        sys.stdout.write("\n[stopped at a stop string]")
    sys.stdout.write("\n\n")
    if colour:
        sys.stdout.write(f"{COLOUR_DRAFT}accepted from the draft{COLOUR_RESET}  {COLOUR_TARGET}produced by the target{COLOUR_RESET}\n")
    print(f"target {target.name}, draft {draft_label(draft)}")
    print(out.stats.summary())
    if "beam" in out.extra:
        beam = out.extra["beam"]
        label = "exact" if beam.get("exact") else "APPROXIMATE (report's Algorithm 2)"
        print(f"beam search: mode {beam.get('mode')} ({label}), score {beam['score']:.4f}, "
              f"steps {beam.get('steps')}, accepted draft steps {beam.get('accepted_steps')}")
    if args.verbose:
        print(f"specdec: peak memory of the whole run {_peak_rss_gib():.2f} GiB (peak resident set size)",
              file=sys.stderr)
    return 0


def _peak_rss_gib() -> float:
    """This process's peak resident set size (Linux and macOS), in GiB; 0 where unknown."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # bytes on macOS, KiB on Linux


def _print_load(target, draft, load_seconds: float) -> None:
    """--verbose: load times (conversion included on a preset's first use) and peak memory after loading."""
    parts = [f"target {target.name} ({str(target.dtype).replace('torch.', '')}) {getattr(target, 'load_seconds', 0.0):.1f} s"]
    for d in draft if isinstance(draft, list) else [draft]:
        seconds = getattr(d, "load_seconds", None)
        if seconds is not None:
            parts.append(f"draft {d.name} {seconds:.1f} s")
    print(f"specdec: loaded in {load_seconds:.1f} s: {', '.join(parts)}; peak memory {_peak_rss_gib():.2f} GiB "
          "(peak resident set size)", file=sys.stderr)


def _serve(args: argparse.Namespace) -> int:
    from specdec import serve
    from specdec.errors import SpecDecError

    if args.max_queue < 0 or args.timeout <= 0:
        raise SpecDecError("--max-queue must be >= 0 and --timeout > 0")
    if args.max_positions < 1:
        raise SpecDecError(f"--max-positions must be >= 1, got {args.max_positions}")
    if args.max_batch is None:
        from specdec.devices import resolve_device

        args.max_batch = SERVED_BATCH_CPU if resolve_device(args.device).type == "cpu" else 1
    if args.max_batch < 1:
        raise SpecDecError(f"--max-batch must be >= 1, got {args.max_batch}")
    from specdec.config import GenerationConfig

    # Checked before the models load (in the background once the server is up): the speculation options
    # every request starts from, and the models.
    GenerationConfig.from_options(gamma=args.gamma, gamma_schedule=args.gamma_schedule, max_gamma=args.max_gamma,
                                  confidence=args.confidence)
    _check_models(args)
    if args.ui:
        print(f"specdec: the playground will be at http://{args.host}:{args.port}/ once the models are loaded",
              file=sys.stderr)
    serve.run(lambda: load_served(args), host=args.host, port=args.port, max_queue=args.max_queue,
              api_key=args.api_key, log_level=args.log_level, ui=args.ui, max_batch=args.max_batch)
    return 0


def load_served(args: argparse.Namespace) -> Any:
    """What ``specdec serve`` serves (run on the server's worker before it reports ready): the models, their
    steps prepared (:func:`prepare_served_steps`), and the speculation defaults of the command line."""
    from specdec import serve

    def speculation(draft: str | None, gamma: int | None) -> tuple[int | None, str | None]:
        """The speculation defaults (specdec.config.speculation_defaults) for a request's draft specification
        and gamma (None: the command line's)."""
        from specdec.config import speculation_defaults

        return speculation_defaults(draft or draft_spec(args), args.gamma if gamma is None else gamma,
                                    args.gamma_schedule)

    target, draft = load_models(args)
    engine = None
    if (args.max_batch or 1) > 1:
        engine = batch_engine(target, draft, args.max_batch, args.max_positions, *speculation(None, None),
                              args.max_gamma)
    else:
        prepare_served_steps(target, draft, args.max_positions)
    return serve.Served(model_id=args.target, target=target, draft=draft, draft_label=draft_label(draft),
                        speculation=speculation, options={"max_gamma": args.max_gamma, "confidence": args.confidence},
                        timeout=args.timeout, engine=engine)


def batch_engine(target: Any, draft: Any, max_batch: int, max_positions: int, gamma: int | None,
                 gamma_schedule: str | None, max_gamma: int | None) -> Any:
    """The BatchEngine of ``specdec serve --max-batch N``: the served draft model drafts for every row that
    uses it (a parameter-free served draft is each row's own)."""
    from specdec.batching import BatchEngine
    from specdec.config import GenerationConfig
    from specdec.errors import SpecDecError
    from specdec.models import LanguageModel, same_vocabulary

    if isinstance(draft, list) or (isinstance(draft, LanguageModel) and not same_vocabulary(target, draft)):
        raise SpecDecError("--max-batch > 1 drafts with one model that shares the target's tokenizer (or a "
                           "parameter-free draft); serve hierarchies and drafts with another tokenizer with --max-batch 1")
    config = GenerationConfig.from_options(gamma=gamma, gamma_schedule=gamma_schedule, max_gamma=max_gamma)
    model = draft if isinstance(draft, LanguageModel) else None
    return BatchEngine(target, model, max_batch, max_positions, gamma=config.gamma, max_gamma=config.gamma_bound)


def _presets() -> int:
    from specdec.models.catalog import PRESETS

    for name, preset in PRESETS.items():
        print(f"{name:22s} {preset.description}\n{'':22s} install: {preset.pip_command}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from specdec.errors import SpecDecError

    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "bench":
            from specdec import bench

            return bench.main(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "presets":
            return _presets()
        if args.command == "alpha":
            from specdec import alpha

            return alpha.main(args)
        if args.command == "plot":
            from specdec.publish import plots as plot

            return plot.main(args)
        if args.command == "results":
            from specdec.publish import results

            return results.main(args)
    except SpecDecError as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nspecdec: interrupted", file=sys.stderr)
        return 130
    return 1


def entry() -> None:
    """The console script (and ``python -m specdec.cli``): :func:`main`, and after ``generate`` an exit
    that skips the interpreter's teardown: freeing a loaded pair's objects one by one is a noticeable part
    of a short run (README, "Loading the presets"), and the operating system frees the process at once.
    Output is flushed first; nothing else is open by then."""
    code = main()
    if sys.argv[1:2] == ["generate"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    entry()

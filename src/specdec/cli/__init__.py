"""The ``specdec`` command: a thin layer that parses, calls the library and prints.

The parser is :mod:`specdec.cli.parser`; the models a command line names, checked and then loaded,
:mod:`specdec.cli.models`; ``specdec serve``'s wiring :mod:`specdec.cli.serve`. Here: ``specdec generate``
(streamed and coloured by origin), ``specdec presets`` and the dispatch of every subcommand.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import warnings
from typing import Sequence

from specdec.cli.models import (check_models, draft_label, draft_spec, gamma_of, load_models, native_models,
                                target_quantization)
from specdec.cli.parser import SERVED_BATCH_CPU, SERVED_POSITIONS, build_parser
from specdec.cli.serve import batch_engine, load_served, prepare_served_steps, serve_command

__all__ = ["main", "entry", "build_parser", "draft_spec", "target_quantization", "check_models", "load_models",
           "draft_label", "load_served", "batch_engine", "prepare_served_steps", "SERVED_POSITIONS", "SERVED_BATCH_CPU"]

# ANSI colours for --color: tokens accepted from the draft vs tokens produced by the target (paper Figure 1).
COLOUR_DRAFT = "\033[32m"  # green
COLOUR_TARGET = "\033[1;34m"  # bold blue
COLOUR_RESET = "\033[0m"


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


def constraint_options(args: argparse.Namespace) -> dict[str, str]:
    """json_schema / regex / grammar from --json-schema FILE, --regex PATTERN, --grammar FILE (files read here)."""
    from specdec.errors import SpecDecError

    out = {"regex": args.regex}
    for key, path, what in (("json_schema", args.json_schema, "JSON schema"), ("grammar", args.grammar, "grammar")):
        if path is not None:
            try:
                out[key] = pathlib.Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else "it is not UTF-8 text"
                raise SpecDecError(f"cannot read the {what} file {path!r}: {reason}; give the path of a "
                                   f"file that holds the {what}") from None
    return out


def prediction_text(args: argparse.Namespace) -> str | None:
    """--prediction FILE (or '-': standard input, when the prompt is not read from it), read here."""
    from specdec.errors import SpecDecError

    path = getattr(args, "prediction", None)
    if path is None:
        return None
    if path == "-":
        if args.prompt == "-":
            raise SpecDecError("the prompt and --prediction cannot both come from standard input: give one a file")
        return sys.stdin.read()
    try:
        return pathlib.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else "it is not UTF-8 text"
        raise SpecDecError(f"cannot read the prediction file {path!r}: {reason}; give the path of a file that holds "
                           "the text the output is expected to repeat") from None


def _generate(args: argparse.Namespace) -> int:
    import specdec

    prediction = prediction_text(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    config = specdec.GenerationConfig.from_options(
        gamma=gamma_of(args), temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, stop=args.stop, seed=args.seed, chat=args.chat,
        gamma_schedule=args.gamma_schedule, max_gamma=args.max_gamma, confidence=args.confidence,
        lenience=args.lenience, verification=args.verification, num_beams=args.num_beams,
        draft_beams=args.draft_beams, beam_mode=args.beam_mode,
        length_penalty=args.length_penalty, forced_drafts=args.forced_drafts, prediction=prediction,
        **constraint_options(args),
    )
    if not prompt.strip():
        raise specdec.SpecDecError("the prompt is empty; give some text to continue"
                                   + (" (standard input was empty)" if args.prompt == "-" else ""))
    check_models(args)  # everything is checked before the first model loads
    from specdec.models import check_prompt

    with native_models(args):
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
    if out.stats.constraint and not out.stats.constraint["complete"]:
        print(f"specdec: the output ends before {config.constraint.label} is complete (stopped: "
              f"{out.stats.stop_reason}); raise --max-new-tokens", file=sys.stderr)
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
    from specdec.models import Model

    def code(model) -> str:  # specdec.models.native.causal_lm's module tree, or transformers' model
        return " (specdec's native model)" if getattr(getattr(model, "hf_model", None), "native", False) else ""

    parts = [f"target {target.name} ({str(target.dtype).replace('torch.', '')}) {target.load_seconds or 0.0:.1f} s"
             f"{code(target)}"]
    from specdec.drafters import plan_draft

    for d in (level.name for level in plan_draft(draft).levels):
        if isinstance(d, Model) and d.load_seconds is not None:
            parts.append(f"draft {d.name} {d.load_seconds:.1f} s{code(d)}")
    print(f"specdec: loaded in {load_seconds:.1f} s: {', '.join(parts)}; peak memory {_peak_rss_gib():.2f} GiB "
          "(peak resident set size)", file=sys.stderr)


def _presets() -> int:
    from specdec.models.formats.catalog import PRESETS

    for name, preset in PRESETS.items():
        print(f"{name:22s} {preset.description}\n{'':22s} install: {preset.pip_command}")
    return 0


def _one_line(message, category, filename, lineno, line=None) -> str:
    return f"specdec: warning: {message}\n" if issubclass(category, UserWarning) else \
        f"{filename}:{lineno}: {category.__name__}: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    from specdec.errors import SpecDecError

    args = build_parser().parse_args(argv)
    warnings.formatwarning = _one_line  # a user of the command reads the warning, not specdec's source line
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "bench":
            from specdec import bench

            return bench.main(args)
        if args.command == "serve":
            return serve_command(args)
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
    of a short run (docs/presets.md, "Loading the presets"), and the operating system frees the process at once.
    Output is flushed first; nothing else is open by then."""
    code = main()
    if sys.argv[1:2] == ["generate"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


"""``specdec serve`` wired to the library: the options checked before the models load, what the server
serves (the models, their steps prepared or the batch engine, the command line's generation options), then the
server."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from specdec.cli.models import check_models, draft_label, draft_spec, gamma_of, load_models
from specdec.cli.parser import SERVED_BATCH_CPU


def serve_command(args: argparse.Namespace) -> int:
    from specdec import serve
    from specdec.errors import SpecDecError

    if args.max_queue < 0 or args.timeout <= 0:
        raise SpecDecError("--max-queue must be >= 0 and --timeout > 0")
    if args.max_positions < 1:
        raise SpecDecError(f"--max-positions must be >= 1, got {args.max_positions}")
    if args.prefill_chunk is not None and args.prefill_chunk < 0:
        raise SpecDecError(f"--prefill-chunk is a number of tokens, >= 0 (0: a prompt in one pass), got {args.prefill_chunk}")
    if args.prefix_cache < 0:
        raise SpecDecError(f"--prefix-cache is a size in MB, >= 0 (0: no prefix cache), got {args.prefix_cache:g}")
    if args.max_batch is None:
        from specdec.devices import resolve_device

        args.max_batch = SERVED_BATCH_CPU if resolve_device(args.device).type == "cpu" else 1
    if args.max_batch < 1:
        raise SpecDecError(f"--max-batch must be >= 1, got {args.max_batch}")
    from specdec.config import GenerationConfig

    # Checked before the models load (in the background once the server is up): the speculation options
    # every request starts from (the default draft's gamma on this device where --gamma is not given), and the models.
    args.gamma = gamma_of(args)
    GenerationConfig.from_options(gamma=args.gamma, gamma_schedule=args.gamma_schedule, max_gamma=args.max_gamma,
                                  confidence=args.confidence)
    check_models(args)
    if args.ui:
        print(f"specdec: the playground will be at http://{args.host}:{args.port}/ once the models are loaded",
              file=sys.stderr)
    serve.run(lambda: load_served(args), host=args.host, port=args.port, max_queue=args.max_queue,
              api_key=args.api_key, log_level=args.log_level, ui=args.ui, max_batch=args.max_batch)
    return 0


def load_served(args: argparse.Namespace) -> Any:
    """What ``specdec serve`` serves (run on the server's worker before it reports ready): the models, their
    steps prepared (:func:`prepare_served_steps`), and the generation options of the command line."""
    from specdec import serve

    target, draft = load_models(args)
    engine = None
    if (args.max_batch or 1) > 1:
        engine = batch_engine(target, draft, args.max_batch, args.max_positions, args.gamma, args.gamma_schedule,
                              args.max_gamma, int(args.prefix_cache * 2**20), args.prefill_chunk,
                              args.batch_speculation)
    else:
        prepare_served_steps(target, draft, args.max_positions)
    return serve.Served(model_id=args.target, target=target, draft=draft, draft_label=draft_label(draft),
                        options={"gamma": args.gamma, "gamma_schedule": args.gamma_schedule,
                                 "max_gamma": args.max_gamma, "confidence": args.confidence},
                        timeout=args.timeout, engine=engine)


def batch_engine(target: Any, draft: Any, max_batch: int, max_positions: int, gamma: int | None,
                 gamma_schedule: str | None, max_gamma: int | None, prefix_cache_bytes: int = 0,
                 prefill_chunk: int | None = None, speculation: str = "measured") -> Any:
    """The BatchEngine of ``specdec serve --max-batch N``: the served draft's model drafts for every row that
    uses it (a parameter-free served draft is each row's own); a lone row drafts with the whole served draft
    (a hierarchy: the model under prompt lookup) through the one-sequence engine (:mod:`specdec.batch.alone`)."""
    from specdec.batch.engine import BatchEngine, alone_draft, batch_drafting
    from specdec.config import GenerationConfig

    model, _ = batch_drafting(target, draft)  # the one decision of what a batch's rows draft with
    config = GenerationConfig.from_options(gamma=gamma, gamma_schedule=gamma_schedule, max_gamma=max_gamma)
    engine = BatchEngine(target, model, max_batch, max_positions, gamma=config.gamma, max_gamma=config.gamma_bound,
                         alone_draft=alone_draft(draft, model), prefix_cache_bytes=prefix_cache_bytes,
                         speculation=speculation,
                         **({} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}))
    engine.calibrate()  # the batch's pass and draft-step times, before the first request (speculation="measured")
    return engine


def prepare_served_steps(target: Any, draft: Any, max_positions: int | None = None) -> None:
    """Fix the capture plan of the served models before the server is ready (:func:`specdec.decoding.prepare_steps`):
    caches of ``max_positions`` positions, and the steps of the widest gamma a graph can verify (every width
    bucket of the target: a request may ask for any gamma) captured and, with ``compile``, compiled, so that
    no request captures anything; greedy rounds of gamma 1 to 8 (and plain decoding's step) are captured whole
    too (:mod:`specdec.round_graph`)."""
    from specdec.decoding import prepare_steps
    from specdec.models.sessions.graphs import MAX_GRAPH_WIDTH

    prepare_steps(target, [draft] if draft is not None else [], [*range(1, 9), MAX_GRAPH_WIDTH - 1], max_positions)

"""The decoding loop. Plain autoregressive decoding (no draft) and speculative decoding share it.

generate() = prepare, then rounds until done, then finish. Each round:
  1. the drafter proposes up to gamma tokens (none without a draft), as device tensors;
  2. the target scores its last token plus the drafted ones in one forward pass (``extend``); in the first
     round the last token's logits come with the prefill (which covers the whole prompt), so the pass
     covers the drafts only, and a plain first step needs no pass (as in transformers and llama.cpp);
  3. ``acceptance.verify`` accepts a prefix of the draft and appends one target token, on the device;
  4. one read-back brings (tokens, n, betas) to the host: the round's only synchronization;
  5. the caches roll back to what was accepted (``rollback``: bookkeeping only);
  6. EOS, stop strings, max_new_tokens and the context length end the loop.

Invariant between rounds: the target's cache holds every token of ``sequence`` but the last one (before
the first round: all of them, and ``carried`` holds the last one's logits; with CUDA graphs the prefill leaves
out the last token, so the first round is a captured one too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from specdec.config import DEFAULT, GenerationConfig, default_gamma, preset_draft
from specdec.devices import RoundClock, Stopwatch, new_generator
from specdec.drafters import DraftContext, DraftPlan, plan_draft
from specdec.drafters.forced import with_forced
from specdec.drafters.prediction import with_prediction
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, load
from specdec.models.causal import new_token_limit
from specdec.capture_plan import prepare_steps  # noqa: F401 (its public home)
from specdec.round_graph import graphed_round
from specdec.rounds import check_dead_end, speculative_round
from specdec.run_state import (  # noqa: F401 (re-exported: their public home was here)
    GenerationOutput,
    RoundCallback,
    RoundEvent,
    RunState,
    TokenCallback,
    append_tokens,
    finish_output,
)
from specdec.sampling import SamplingParams
from specdec.schedules import StepFeedback, make_schedule
from specdec.stats import GenerationStats
from specdec.text import StopScan

def _beam_generate(target: LanguageModel, draft: Any, prompt_ids: list[int], config: GenerationConfig,
                   seed: int) -> GenerationOutput:
    """Beam search (plain, exact speculative A.4, or the report's approximate variant) through specdec.beam."""
    from specdec.beam import beam_search

    out = beam_search(
        target, prompt_ids, num_beams=config.num_beams, max_new_tokens=config.max_new_tokens, draft=draft,
        draft_beams=config.draft_beams, gamma=config.gamma, mode=config.beam_mode,
        length_penalty=config.length_penalty, early_stopping=config.early_stopping, seed=seed,
    )
    b = out.stats
    stats = GenerationStats(
        new_tokens=len(out.token_ids), prompt_tokens=len(prompt_ids), target_calls=b.get("target_calls", 0),
        draft_calls=b.get("draft_calls", 0), time_total=b.get("time_total_s", 0.0), seed=seed,
        stop_reason=b.get("stop_reason", ""), exact=bool(b.get("exact", True)),
    )
    stats.time_draft = b.get("time_draft_s", 0.0)
    stats.time_target = b.get("time_target_s", 0.0)
    return GenerationOutput(target.decode(out.token_ids), list(out.token_ids), [False] * len(out.token_ids),
                            list(prompt_ids), stats, config, extra={"beam": {**b, "score": out.score}})


def generate(
    target: Any,
    prompt: str | Sequence[int],
    *,
    draft: Any = DEFAULT,
    config: GenerationConfig | None = None,
    on_tokens: TokenCallback | None = None,
    on_round: RoundCallback | None = None,
    **options: Any,
) -> GenerationOutput:
    """Generate a continuation of ``prompt`` with the target model, speculatively when ``draft`` is given.

    target: a model from :func:`specdec.load` (or anything it accepts).
    prompt: text, or a list of token ids (then ``chat`` is ignored).
    draft: None (plain decoding), a drafter name ("prompt-lookup", "bigram", "unigram", "random"),
      a model (loaded or a preset name), a :class:`~specdec.drafters.Drafter`, or a list of them for
      hierarchical drafting (``[draft_model, "prompt-lookup"]``). Left to the default (``"default"``): the
      packaged target's default draft, as the CLI and the server draft (on CPU the quantized 0.5B under prompt
      lookup, loaded once), and plain decoding for any other target or a beam search
      (:func:`specdec.config.preset_draft`).
    config / options: a :class:`GenerationConfig`, or its fields as keywords (gamma, temperature,
      top_k, top_p, max_new_tokens, stop, chat, seed, gamma_schedule, max_gamma, confidence, lenience).
    on_tokens: streaming callback, see :data:`TokenCallback`.
    on_round: a callback per target call with what was drafted and accepted, see :class:`RoundEvent`.

    At temperature 0 the tokens equal plain greedy decoding of the target; otherwise they follow the
    target's standardized distribution exactly (Leviathan et al., Appendix A.1).
    """
    gamma_given = config is not None or options.get("gamma") is not None
    if config is None:
        config = GenerationConfig.from_options(**options)
    elif options:
        raise SpecDecError("pass either config= or keyword options, not both")
    if isinstance(draft, str) and draft == DEFAULT:
        _check_names(target, plan_draft(None))
        target = load(target)
        draft = preset_draft(target) if config.num_beams == 1 else None
        if draft is not None and not gamma_given:  # the default draft's gamma on this device
            config = replace(config, gamma=default_gamma(target.device))
    plan = plan_draft(draft)  # a draft is resolved once: parsed, checked, then loaded and built
    _check_names(target, plan)
    target = load(target)
    check_target(target)
    plan = plan.load(target)
    prompt_ids = prompt_token_ids(target, prompt, config)
    seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(4), "little")
    if config.num_beams > 1:
        return _beam_generate(target, plan.draft, prompt_ids, config, seed)
    drafter = plan.build(target, inner_gamma=config.gamma)
    if config.constraint is not None and drafter is not None and config.forced_drafts:
        drafter = with_forced(drafter)
    drafter = with_prediction(drafter, prediction_ids(target, config))  # (the prediction first: Predicted Outputs)
    run = _prepare(target, drafter, prompt_ids, config, seed, on_tokens)
    run.on_round = on_round
    try:
        while not run.stats.stop_reason:
            _round(run)
    finally:
        run.close()
    return finish_output(run)


def check_target(target: Any) -> None:
    """A llama.cpp model drafts only: its batched passes are not block-invariant, so it cannot verify."""
    from specdec.models import LLAMA_CPP, Model

    if isinstance(target, Model) and target.quantization == LLAMA_CPP:
        raise SpecDecError(f"{target.name} runs in llama.cpp, which specdec uses for drafts only (its multi-token "
                           "passes differ from its one-token steps, so verification would not be exact); load "
                           "the target with quantize='int8' (--quantize int8) or in bf16")


def _check_names(target: Any, plan: DraftPlan) -> None:
    """Models given by name (the target, the plan's model levels) are checked before the first one loads."""
    from specdec.models import source_kind

    if isinstance(target, (str, os.PathLike)):
        source_kind(target)
    plan.check()


def prediction_ids(target: LanguageModel, config: GenerationConfig) -> list[int]:
    """The prediction's tokens as the target would write them (no special tokens added), checked: it must fit the
    target's context. [] without a prediction."""
    if config.prediction is None:
        return []
    ids = list(target.tokenizer(config.prediction, add_special_tokens=False)["input_ids"])
    if target.max_context is not None and len(ids) > target.max_context:
        raise SpecDecError(f"the prediction has {len(ids)} tokens but {target.name} reads at most {target.max_context}; "
                           "shorten it (it is the text the output is expected to repeat)")
    return ids


def prompt_token_ids(target: LanguageModel, prompt: str | Sequence[int], config: GenerationConfig) -> list[int]:
    """The prompt as the target's token ids, checked (not empty, within the context). The batch engine's too."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise SpecDecError("the prompt is empty; give some text to continue")
        prompt_ids = target.encode(prompt, chat=config.chat)
    else:
        prompt_ids = [int(t) for t in prompt]
        bad = [t for t in prompt_ids if not 0 <= t < target.vocab_size]
        if bad:
            raise SpecDecError(f"prompt token ids must be in [0, {target.vocab_size}), got {bad[:5]}")
    return prompt_ids  # its length is checked against the context by new_token_limit (loop and beam search)


@dataclass(kw_only=True, eq=False)
class _Run(RunState):
    """One generation alone between prepare and finish: a :class:`~specdec.run_state.RunState` (its session and
    round clock set) that gives its caches back when it closes."""

    def close(self) -> None:
        """Give every cache back to its model's pool: the target's and every draft level's."""
        try:
            self.session.close()
        finally:
            if self.drafter is not None:
                self.drafter.close()


def _prepare(target: LanguageModel, drafter: Any, prompt_ids: list[int], config: GenerationConfig, seed: int,
             on_tokens: TokenCallback | None) -> _Run:
    device = target.device
    stats = GenerationStats(prompt_tokens=len(prompt_ids), seed=seed)
    wall = Stopwatch(device)
    t_start = wall()
    limit = new_token_limit(len(prompt_ids), config.max_new_tokens, target.max_context, target.name)
    session, sequence = target.start(prompt_ids, len(prompt_ids) + limit + 1)
    run = _Run(target=target, prompt_ids=prompt_ids, config=config, drafter=drafter,
               schedule=make_schedule(config.gamma_schedule, config.gamma, config.gamma_bound), sequence=sequence,
               ids=device_ids(sequence, len(sequence) + limit + 1, device), start_len=len(sequence), limit=limit,
               generator=new_generator(device, seed), eos=target.eos_token_ids, stats=stats, on_tokens=on_tokens,
               t_start=t_start, session=session, clock=RoundClock(device))
    try:
        _start(run, wall)
    except BaseException:
        run.close()  # the caches go back to their pools (a grammar the tokenizer cannot express, a drafter refusing)
        raise
    return run


def _start(run: _Run, wall: Stopwatch) -> None:
    """The rest of _prepare, once the target's session is open: stop strings, the constraint, the prefill, the
    drafter's start."""
    target, config, sequence, device, stats = run.target, run.config, run.sequence, run.target.device, run.stats
    prompt_ids, drafter, limit = run.prompt_ids, run.drafter, run.limit
    if config.stop:
        run.stop_scan = StopScan(target.decode, config.stop, target.piece_bytes)
    if config.constraint is not None:
        from specdec.constraints import Constraint

        run.constraint = Constraint(config.constraint, target, len(sequence), device)
    t0 = wall()
    if target.cuda_graphs and config.constraint is None and len(sequence) >= 2:
        # all but the last token, as the draft does: the first round then runs like every other one (its graph
        # feeds the last token), not step by step after a prefill that brought the first token's logits
        run.session.prefill(sequence[:-1])
    else:  # the whole sequence: its last position's logits give the first token (or verify the first draft)
        run.carried = run.session.prefill(sequence)[None]  # [1, V]
    stats.time_prefill += wall() - t0
    if drafter is not None:
        t0 = wall()
        source = prompt_ids if target.is_encoder_decoder else ()
        stop_below = config.confidence if config.gamma_schedule == "confidence" else None
        drafter.start(DraftContext(prompt_ids, config.sampling, run.generator, target.vocab_size, frozenset(run.eos),
                                   source, stop_below, device, len(sequence) + limit + 1, run.ids, run.constraint))
        started = wall() - t0
        stats.time_draft += started
        stats.time_draft_start += started


def device_ids(sequence: list[int], positions: int, device: torch.device) -> torch.Tensor:
    """[positions] long on ``device``, the sequence in its first len(sequence) entries (one upload, at the start)."""
    ids = torch.zeros(positions, dtype=torch.long, device=device)
    ids[: len(sequence)] = torch.tensor(sequence, dtype=torch.long, device=device)
    return ids


def _round(run: _Run) -> None:
    """One draft-verify round of the target; sets ``run.stats.stop_reason`` when the generation ends."""
    config, drafter = run.config, run.drafter
    generated = len(run.sequence) - run.start_len
    # Never draft past the budget: n accepted + 1 target token must fit.
    wanted = run.schedule.next_gamma() if drafter is not None else 0
    reach = getattr(drafter, "reach", None)  # a prediction, a copy: more at once (they cost no draft model)
    if reach is not None:
        wanted = reach(run.sequence, wanted)
    k = min(wanted, run.limit - generated - 1)
    length = len(run.sequence)
    carried, run.carried = run.carried, None
    # [1] the sequence's last token, which the target's cache lacks; [0] after the prefill (it cached them all)
    pending = run.ids[length - (carried is None): length]
    # the whole round as one captured graph, if planned (not under a constraint: its masks come from the host)
    r = graphed_round(run, k, wanted) if carried is None and run.constraint is None else None
    if r is None:
        r = speculative_round(run.session, drafter, run.sequence, k, pending, config.sampling, run.generator,
                              run.clock, lenience=config.lenience, verification=config.verification, carried=carried,
                              constraint=run.constraint)
        run.stats.rounds_per_step += bool(run.target.cuda_graphs)
        if run.constraint is not None:
            run.constraint.commit()
            check_dead_end(run, r.new)
    run.stats.record_round(r)
    if (observe := getattr(drafter, "observe_pass", None)) is not None:  # proposal lengths follow the measured
        observe(run.session.last_pass_tokens, r.time_verify)  # verification cost
    run.ids[length: length + len(r.new)] = r.result.tokens[: len(r.new)]  # the round's tokens stay on the device
    if drafter is not None and (carried is None or r.drafted) and r.proposal.source != "copy":
        # (a round with no pass measured no step; a copy round is not the schedule's draft)
        run.schedule.update(StepFeedback(r.drafted, r.n, r.betas, r.time_draft, r.time_verify,
                                         run.session.last_pass_tokens))
    added = append_tokens(run, r.new, [True] * r.n + [False])
    if run.constraint is not None and not run.stats.stop_reason and (r.refused or run.constraint.finished):
        run.stats.stop_reason = "constraint"  # the grammar is complete and allows no end-of-sequence token
    if run.on_round is not None:
        run.on_round(RoundEvent(r.proposal.tokens.tolist(), r.n, added, run.from_draft[len(run.from_draft) - len(added):],
                                r.proposal.source))



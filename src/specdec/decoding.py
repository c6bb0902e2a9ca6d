"""The decoding loop. Plain autoregressive decoding (no draft) and speculative decoding share it.

Each step:
  1. the drafter proposes up to gamma tokens (none without a draft);
  2. the target scores the sequence plus the drafted tokens in one forward pass over its KV cache;
  3. speculative sampling (or, at temperature 0, the exact greedy comparison) accepts a prefix of the
     draft and appends one target token;
  4. the sequence grows by 1 to gamma + 1 tokens; the caches roll back to it on the next call;
  5. EOS, stop strings, max_new_tokens and the context length end the loop.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from specdec.acceptance import (
    acceptance_probability, greedy_verification, lenient_greedy_mask, speculative_sampling,
)
from specdec.config import GenerationConfig
from specdec.drafters import DraftContext, make_drafter
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, load
from specdec.sampling import standardize
from specdec.schedules import StepFeedback, make_schedule
from specdec.stats import GenerationStats

# on_tokens(new_token_ids, from_draft): called as tokens are accepted; from_draft[i] is True when
# token i was proposed by the draft and accepted, False when the target produced it.
TokenCallback = Callable[[list[int], list[bool]], None]


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]  # generated tokens only (EOS included when it ended the generation)
    from_draft: list[bool]  # per generated token: accepted from the draft (True) or produced by the target
    prompt_ids: list[int]
    stats: GenerationStats
    config: GenerationConfig
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "from_draft": self.from_draft,
            "stats": self.stats.to_dict(),
            "config": self.config.to_dict(),
            **({"extra": self.extra} if self.extra else {}),
        }


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


def _find_stop(text: str, stops: Sequence[str]) -> int | None:
    positions = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(positions) if positions else None


def generate(
    target: Any,
    prompt: str | Sequence[int],
    *,
    draft: Any = None,
    config: GenerationConfig | None = None,
    on_tokens: TokenCallback | None = None,
    **options: Any,
) -> GenerationOutput:
    """Generate a continuation of ``prompt`` with the target model, speculatively when ``draft`` is given.

    target: a model from :func:`specdec.load` (or anything it accepts).
    prompt: text, or a list of token ids (then ``chat`` is ignored).
    draft: None (plain decoding), a drafter name ("prompt-lookup", "bigram", "unigram", "random"),
      a model (loaded or a preset name), a :class:`~specdec.drafters.Drafter`, or a list of them for
      hierarchical drafting (``[draft_model, "prompt-lookup"]``).
    config / options: a :class:`GenerationConfig`, or its fields as keywords (gamma, temperature,
      top_k, top_p, max_new_tokens, stop, chat, seed, gamma_schedule, max_gamma, confidence, lenience).
    on_tokens: streaming callback, see :data:`TokenCallback`.

    At temperature 0 the tokens equal plain greedy decoding of the target; otherwise they follow the
    target's standardized distribution exactly (Leviathan et al., Appendix A.1).
    """
    if config is None:
        config = GenerationConfig.from_options(**options)
    elif options:
        raise SpecDecError("pass either config= or keyword options, not both")
    target = load(target)
    drafter = make_drafter(draft, target, inner_gamma=config.gamma)
    schedule = make_schedule(config.gamma_schedule, config.gamma, config.gamma_bound)

    if isinstance(prompt, str):
        if not prompt.strip():
            raise SpecDecError("the prompt is empty; give some text to continue")
        prompt_ids = target.encode(prompt, chat=config.chat)
    else:
        prompt_ids = [int(t) for t in prompt]
        bad = [t for t in prompt_ids if not 0 <= t < target.vocab_size]
        if bad:
            raise SpecDecError(f"prompt token ids must be in [0, {target.vocab_size}), got {bad[:5]}")
    if not prompt_ids:
        raise SpecDecError("the prompt is empty (no tokens); give some text to continue")
    max_context = target.max_context
    if max_context is not None and len(prompt_ids) >= max_context:
        raise SpecDecError(
            f"the prompt has {len(prompt_ids)} tokens but {target.name} reads at most {max_context}; "
            "shorten the prompt"
        )

    seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(4), "little")
    if config.num_beams > 1:
        return _beam_generate(target, draft, prompt_ids, config, seed)
    generator = torch.Generator().manual_seed(seed)
    sampling = config.sampling
    eos = target.eos_token_ids
    stats = GenerationStats(prompt_tokens=len(prompt_ids), seed=seed)

    t_start = time.perf_counter()
    session, sequence = target.start(prompt_ids)
    start_len = len(sequence)
    limit = config.max_new_tokens
    if max_context is not None:
        limit = min(limit, max_context - start_len)
    if drafter is not None:
        t0 = time.perf_counter()
        source = prompt_ids if target.is_encoder_decoder else ()
        stop_below = config.confidence if config.gamma_schedule == "confidence" else None
        drafter.start(DraftContext(prompt_ids, sampling, generator, target.vocab_size, frozenset(eos), source, stop_below))
        stats.time_draft += time.perf_counter() - t0
    from_draft: list[bool] = []
    stop_text: str | None = None

    while True:
        generated = len(sequence) - start_len
        # Never draft past the budget: n accepted + 1 target token must fit.
        k = min(schedule.next_gamma(), limit - generated - 1) if drafter is not None else 0
        t0 = time.perf_counter()
        if k > 0:
            calls_before = drafter.forward_passes
            proposal = drafter.propose(sequence, k)
            stats.draft_calls += drafter.forward_passes - calls_before
        else:
            proposal = None
        t1 = time.perf_counter()
        stats.time_draft += t1 - t0
        draft_tokens = proposal.tokens if proposal is not None else torch.empty(0, dtype=torch.long)  # [g]
        g = int(draft_tokens.shape[0])
        logits = session.forward(sequence + draft_tokens.tolist(), g + 1)  # [g + 1, V]
        t2 = time.perf_counter()
        stats.time_target += t2 - t1

        if sampling.greedy:
            target_argmax = logits.argmax(dim=-1)  # [g + 1]
            lenient = lenient_greedy_mask(logits, draft_tokens, config.lenience) if not config.exact and g else None
            tokens, n = greedy_verification(target_argmax, draft_tokens, lenient)
            m = min(n + 1, g)
            ok = target_argmax[:m] == draft_tokens[:m]
            betas = (ok if lenient is None else ok | lenient[:m]).float().tolist()
        else:
            p = standardize(logits, sampling)  # [g + 1, V]
            q = proposal.q if proposal is not None else None
            tokens, n = speculative_sampling(p, q, draft_tokens, generator, lenience=config.lenience)
            m = min(n + 1, g)
            q_m = None if q is None else q[:m]
            if config.exact:
                betas = acceptance_probability(p[:m], q_m, draft_tokens[:m]).tolist()
            else:  # Appendix A.5: sum_x min(p(x) / l, q(x))
                betas = acceptance_probability(p[:m] / config.lenience, q_m, draft_tokens[:m]).clamp(max=1.0).tolist()
        stats.record_step(g, n, betas)
        if drafter is not None:
            drafter.update(n)
            schedule.update(StepFeedback(g, n, betas, t1 - t0, t2 - t1, session.last_pass_tokens))

        new = tokens.tolist()
        origins = [True] * n + [False]
        done = ""
        for j, tok in enumerate(new):
            if tok in eos:
                new, origins, done = new[: j + 1], origins[: j + 1], "eos"
                break
        sequence.extend(new)
        from_draft.extend(origins)
        if config.stop:
            text = target.decode(sequence[start_len:])
            cut = _find_stop(text, config.stop)
            if cut is not None:
                # Keep the tokens up to the one that completed the stop string; the text ends before it.
                before = len(sequence) - len(new)
                while len(sequence) > before + 1 and _find_stop(target.decode(sequence[start_len:-1]), config.stop) is not None:
                    sequence.pop()
                    from_draft.pop()
                new = sequence[before:]
                stop_text, done = text[:cut], "stop"
        if on_tokens is not None and new:
            on_tokens(new, origins[: len(new)])
        generated = len(sequence) - start_len
        if not done and generated >= limit:
            done = "max_new_tokens" if generated >= config.max_new_tokens else "context"
        if done:
            stats.stop_reason = done
            break

    token_ids = sequence[start_len:]
    stats.new_tokens = len(token_ids)
    stats.time_total = time.perf_counter() - t_start
    stats.exact = config.exact
    if not config.exact:
        stats.not_exact_reason = f"lenience {config.lenience:g} < 1: the output does not follow the target's distribution"
    if drafter is not None and getattr(target, "quantization", None):
        # Dynamic int8 quantizes activations with one scale per forward pass, so the quantized target's
        # logits for a token depend on how many tokens share that pass (1 in plain decoding, gamma + 1 in
        # verification). Measured: 1 of 20 greedy outputs equal to its own plain decoding.
        stats.exact = False
        stats.not_exact_reason = (f"the target is dynamically quantized ({target.quantization}): its logits depend on "
                                  "how many tokens a forward pass covers, so verification is not token-identical to "
                                  "its own plain decoding")
    if hasattr(drafter, "level_stats"):
        stats.levels = drafter.level_stats()
    if drafter is not None:
        stats.schedule = schedule.report()
    text = stop_text if stop_text is not None else target.decode(token_ids)
    return GenerationOutput(text, token_ids, from_draft[: len(token_ids)], list(prompt_ids), stats, config)

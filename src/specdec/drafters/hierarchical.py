"""Hierarchical speculative decoding: a model draft that is itself accelerated by a cheaper draft.

The report's Algorithm 3 (three models), generalised to any depth: level 0 is the target, level 1 a
draft model M_1, level 2 a cheaper draft M_2 (a smaller model, prompt lookup, a bigram...), and so
on. To propose k tokens, level 1 runs speculative decoding itself, verifying level 2's proposals with
speculative sampling. Every token it emits is an exact sample from M_1's standardized distribution,
and M_1 computed that distribution while verifying, so those rows are exactly the q the target
needs. The target then verifies them as usual: its output follows p exactly, whatever the depth.

    specdec.generate(target, prompt, draft=[draft_model, "prompt-lookup"])

With ``copy_first`` (the spec ``copy+A<-prompt-lookup``: the CPU default) the level proposes to the target directly
where the sequence repeats itself (:mod:`specdec.drafters.copying`): a copy of the text that followed its last tokens
earlier, as long as Theorem 8 with a free draft favours over this generation's measured pass times, wherever that
expects more tokens a second than a model round does (its measured acceptance and draft time); M_1 catches up on the
copied tokens when it next drafts.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from specdec.analysis import expected_tokens
from specdec.devices import RoundClock
from specdec.drafters.base import (Draft, DraftContext, Drafter, DrafterBase, DrafterStats, StepWidths,
                                  merge_widths)
from specdec.drafters.copying import MAX_COPY, CopyAcceptance, find_copy
from specdec.drafters.model import ModelDrafter
from specdec.drafters.spec import COPY_FIRST
from specdec.models import LanguageModel
from specdec.models.sessions.window import WINDOW, WINDOW_SAVING, WindowSession
from specdec.schedules import AlphaEstimate, DecayedTimes
from specdec.stats import LevelStats

# Copying first, before this generation has timed two pass sizes: a pass over n tokens costs PASS_BASE +
# PASS_PER_TOKEN n one-token passes, a model round's draft DRAFT_PER_TOKEN one-token passes a drafted token (the
# int4-mixed 1.5B and the 0.5B under prompt lookup, AVX-512 EPYC and AMX Xeon: docs/predicted_outputs.md, serving.md)
PASS_BASE, PASS_PER_TOKEN, DRAFT_PER_TOKEN = 0.4, 0.089, 0.3
MODEL_ALPHA0 = 0.7  # a model round's acceptance before one was verified
# a copy must beat a model round by this much: its estimate is the copies' average, and a copy rejected at its first
# token gives one token where the model gives several (completion on the AMX Xeon: copies at par with the model's rate
# were rejected at once 5 times in 8)
COPY_MARGIN = 0.5
MEASURED_SPAN = 8  # the timed passes decide once their sizes span this many tokens
# Copying first, M_1 starts after this many rounds in a row in which neither a copy nor prompt lookup got a token
# accepted (an edit's answer starts with a line or two of its own: the AMX Xeon's editing requests had 2 such rounds)
LAZY_MISSES = 3
# ... and only for a prompt this long: its prefill by M_1 is what a lazy start may save (2-3 s at 1,100 tokens on the
# AMX Xeon), the rounds before M_1 starts what it costs where the answer is new text (4.5% of a short chat request)
LAZY_PROMPT = 512


class SpeculativeDrafter(ModelDrafter):
    """Level-1 drafter: ``model`` proposes tokens by speculative decoding with ``inner`` as its draft.

    inner_gamma: tokens ``inner`` proposes per verification by ``model``.
    Each proposal runs rounds of :func:`specdec.rounds.speculative_round`, the generation's own round one
    level down; ``level`` (:class:`~specdec.stats.LevelStats`) counts them (calls of ``model``, drafted and
    accepted tokens of ``inner``, alpha between the two, time in each). Each round reads back once.
    """

    _lazy = False  # M_1 not drafting until needed (copying first: start)
    #: Copying first: whether feeding M_1 ``n`` tokens it lacks pays, ``generated`` tokens into this generation
    #: (``(n, generated) -> bool | None``; None: not known). Set before :meth:`start` by whoever has measured the costs
    #: (a server's lone row: :func:`specdec.batch.alone.start_pays`); None: M_1's start follows the prompt's length.
    start_pays: Callable[[int, int], bool | None] | None = None

    def __init__(self, model: LanguageModel, inner: Drafter, inner_gamma: int = 4, copy_first: bool = False):
        super().__init__(model)
        self.inner = inner
        self.inner_gamma = inner_gamma
        self.copy_first = copy_first
        self.name = (COPY_FIRST if copy_first else "") + f"{model.name}<-{inner.name}"
        self.level = LevelStats(level=self.name)
        self._start_copying()

    def _start_copying(self) -> None:
        # the copies' acceptance, their first token's and each later one's (:class:`CopyAcceptance`), and the model
        # rounds'
        self.copying = CopyAcceptance()
        self.model_alpha = AlphaEstimate(MODEL_ALPHA0)
        self.passes = DecayedTimes()  # tokens a verification pass fed -> seconds (this generation's own)
        self.draft_times = DecayedTimes()  # tokens a model round drafted -> seconds
        self._passes_seen = 0
        self._copy: tuple[int, list[int]] | None = None  # (sequence length, tokens) reach chose to copy
        self._copying: int | None = None  # tokens this round copied (None: a model round, or none yet)
        self._drafted: int | None = None  # tokens this round's model drafted
        self.copies = self.copied = self.copies_accepted = 0  # copy rounds, tokens proposed and accepted
        self.misses = 0  # rounds in a row in which the free drafts (copies, the level below) got nothing accepted
        self._from_inner = False  # this round the level below drafted for the target (M_1 not started yet)

    def start(self, context: DraftContext, session: Any = None) -> None:
        """Open M_1's session and cache the prompt (or take ``session``, as a plain model draft does). Copying first
        without a session given, on a prompt of :data:`LAZY_PROMPT` tokens or more, M_1 starts lazily: until
        :data:`LAZY_MISSES` rounds in a row got nothing of the copies or the level below accepted, that level drafts
        for the target directly where no copy does (an edit that copies write is never paid M_1's prompt). Where
        :attr:`start_pays` says feeding M_1 what it lacks does not pay, it starts lazily whatever the prompt's
        length, and wakes only once it does (a short chat answer on a CPU whose 0.5B is dear to feed: never). Where
        feeding it all does not pay but feeding it the last :data:`~specdec.models.sessions.window.WINDOW` tokens does
        (:meth:`_window_pays`), M_1 starts at once on a window (:class:`~specdec.models.sessions.window.WindowSession`):
        what ``session`` holds (a prefix cache's system prompt) and the prompt's end."""
        held, prompt = 0 if session is None else session.length, len(context.prompt_ids)
        may_wait = self.copy_first and not isinstance(self.inner, ModelDrafter)
        by_length = prompt >= LAZY_PROMPT and held == 0  # (a batch row's session that holds nothing yet too)
        dear = may_wait and not by_length and self._feed_pays(prompt, held, prompt) is False
        windowed = dear and self._window_pays(prompt, held, prompt)
        lazy = may_wait and (by_length or dear) and not windowed
        if windowed:  # M_1 fed what its session holds and the prompt's last WINDOW tokens (its first proposal)
            session = self._window(context, session, prompt)
        if lazy and session is None:
            DrafterBase.start(self, context)
            self.close()
            self._proposed = None
        else:
            super().start(context, session)  # M_1's session, as for a plain model draft
        self._lazy = lazy
        # The inner drafter sees the same random source, standardization and device copy of the sequence
        # (this level writes what it emits there, at the positions it drafts for), with M_1's width.
        self.inner.start(context)
        self.level = LevelStats(level=self.name)
        self.clock = RoundClock(context.device)
        self._start_copying()

    def _feed_pays(self, length: int, held: int, prompt: int) -> bool | None:
        """:attr:`start_pays` for M_1 holding ``held`` positions of a sequence of ``length`` whose prompt is
        ``prompt`` tokens (None: not known)."""
        if self.start_pays is None:
            return None
        return self.start_pays(max(length - held, 0), max(length - prompt, 0))

    def _window_pays(self, length: int, held: int, prompt: int) -> bool:
        """Whether feeding M_1 only the last WINDOW tokens of a sequence of ``length`` (it holds ``held``) pays where
        feeding it everything it lacks does not: :attr:`start_pays` for the window's tokens, charged as if its drafts
        saved WINDOW_SAVING of what the whole prompt's do."""
        if self.start_pays is None or WINDOW <= 0 or length - held <= WINDOW:
            return False
        return self.start_pays(math.ceil(WINDOW / WINDOW_SAVING), max(length - prompt, 0)) is True

    def _window(self, context: DraftContext, session: Any, length: int) -> WindowSession:
        """M_1's ``session`` (a fresh one where it holds none) to be fed only the last WINDOW tokens of a sequence of
        ``length`` after what it holds (where :meth:`_window_pays`: more than WINDOW tokens lacking)."""
        if session is None:
            session, _ = self.model.start(context.prompt_ids, context.max_positions)
        return WindowSession(session, length - session.length - WINDOW)

    # --- copying first ---------------------------------------------------------------------------------------------

    def observe_pass(self, tokens: int, seconds: float) -> None:
        """A verification pass of this generation fed ``tokens`` tokens in ``seconds`` (the loop tells it; the first,
        which carries the generation's first-pass costs, is not kept)."""
        self._passes_seen += 1
        if self.copy_first and tokens > 0 and seconds > 0 and self._passes_seen > 1:
            self.passes.observe(tokens, seconds)

    def _pass_seconds(self, tokens: int) -> float:
        """A pass over ``tokens`` tokens: the line through this generation's timed passes once their sizes span
        :data:`MEASURED_SPAN` tokens (a line through neighbouring sizes is their noise, and a size never proposed is
        never timed), else the prior line (:data:`PASS_BASE`, :data:`PASS_PER_TOKEN`) scaled to the timed passes (in
        one-token passes before any)."""
        passes = self.passes
        if len(passes) >= 2 and max(passes) - min(passes) >= MEASURED_SPAN:
            at, slope = passes.line(0)  # type: ignore[misc]
            if at + slope > 0:
                return max(at + slope * tokens, at + slope)

        def prior(n: int) -> float:
            return PASS_BASE + PASS_PER_TOKEN * n

        scale = sum(seconds / prior(n) for n, seconds in passes.items()) / len(passes) if passes else 1.0
        return scale * prior(tokens)

    def _draft_seconds(self, gamma: int) -> float:
        """A model round drafting ``gamma`` tokens: its timed rounds' seconds a drafted token (once passes are timed:
        the same unit), else :data:`DRAFT_PER_TOKEN` one-token passes a token."""
        if self.draft_times and self.passes:
            return gamma * sum(seconds / n for n, seconds in self.draft_times.items()) / len(self.draft_times)
        return DRAFT_PER_TOKEN * gamma * self._pass_seconds(1)

    def reach(self, sequence: Sequence[int], gamma: int) -> int:
        """How many tokens to propose this round, given the schedule's ``gamma``: with copying first, where the
        sequence's last tokens occur earlier in it (:func:`~specdec.drafters.copying.find_copy`), the copy length
        :func:`~specdec.drafters.copying.best_copy` favours, if its tokens a second (its first token's and later
        tokens' acceptance: :func:`~specdec.drafters.copying.copy_tokens` / T(k + 1)) beat a model round's
        E(alpha_model, gamma) / (T(gamma + 1) + D(gamma)) by :data:`COPY_MARGIN`; else ``gamma``."""
        self._copy = None
        ctx = getattr(self, "context", None)
        if not self.copy_first or gamma <= 0 or ctx is None or ctx.constraint is not None:
            return gamma
        self.copying.check(sequence)  # (how far last round's copy, proposed or passed over, held)
        context = [*ctx.source_ids, *sequence] if ctx.source_ids else sequence
        found = find_copy(context, MAX_COPY)
        if not found:
            return gamma
        k, rate = self.copying.best(len(found), self._pass_seconds)
        alpha = min(self.model_alpha.value, 1 - 1e-6)
        model_rate = expected_tokens(alpha, gamma) / (self._pass_seconds(gamma + 1) + self._draft_seconds(gamma))
        self.copying.remember(len(sequence), found)
        if k <= 0 or rate <= model_rate * (1 + COPY_MARGIN):
            return gamma
        self._copy = (len(sequence), found[:k])
        return k

    def _wake(self, window_of: int | None = None) -> None:
        """Start M_1 lazily: cache the prompt but its last token (a session given empty: nothing); its first proposal
        catches up the rest. ``window_of``: the sequence's length, M_1 to be fed only its last WINDOW tokens after
        what its session holds (:class:`~specdec.models.sessions.window.WindowSession`)."""
        self._lazy = False
        t0 = time.perf_counter()
        if window_of is not None:
            self.session = self._window(self.context, self.session, window_of)
        elif self.session is None:
            self.session, prompt = self.model.start(self.context.prompt_ids, self.context.max_positions)
            self.session.prefill(prompt[:-1])
        self.level.time_total += time.perf_counter() - t0

    def _propose_copy(self, sequence: Sequence[int], k: int) -> Draft | None:
        """This round's copy (chosen by :meth:`reach` for this very sequence), cut to ``k``; None: a model round."""
        if self._copy is None or self._copy[0] != len(sequence):
            return None
        tokens = self._copy[1][:k]
        self._copy, self._copying, self._proposed = None, len(tokens), None  # (M_1's cache stays where it was)
        self.copies += 1
        self.copied += len(tokens)
        draft = Draft.from_ids(tokens, self.context.device)
        draft.source = "copy"
        return draft

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        from specdec.rounds import speculative_round  # here: specdec.rounds imports the drafters package

        self._copying = self._drafted = None
        self._from_inner = False
        if k <= 0:
            return Draft.empty(self.context.device)
        copy = self._propose_copy(sequence, k)
        if copy is not None:
            return copy
        if self._lazy:
            held, prompt = 0 if self.session is None else self.session.length, len(self.context.prompt_ids)
            windowed = self.misses >= LAZY_MISSES and self._feed_pays(len(sequence), held, prompt) is False
            if self.misses < LAZY_MISSES or (windowed and not self._window_pays(len(sequence), held, prompt)):
                self._from_inner = True
                return self.inner.propose(sequence, k)  # (one-hot: prompt lookup's tokens)
            self._wake(len(sequence) if windowed else None)
        ctx = self.context
        t_round = time.perf_counter()
        t_start = self.clock.mark()
        tokens: list[int] = []  # host copies (each round's read-back) of what M_1 emitted
        emitted: list[torch.Tensor] = []  # the same tokens on the device: [n + 1] per round
        qs: list[torch.Tensor] = []
        prefix = list(sequence)
        pending = self.unseen(prefix)  # [m] what M_1's cache lacks (device ids, read from the context's copy)
        if not isinstance(pending, torch.Tensor):  # no device copy of the sequence: host ids, one upload
            pending = torch.tensor(pending, dtype=torch.long, device=ctx.device)
        while len(tokens) < k:
            kk = k - len(tokens) - 1  # leave room for M_1's own residual/bonus token
            r = speculative_round(self.session, self.inner, prefix, min(self.inner_gamma, kk), pending,
                                  ctx.sampling, ctx.generator, self.clock, width=ctx.vocab_size,
                                  constraint=ctx.constraint)  # M_1's rows masked as the target's will be
            self.level.record_round(r)
            if r.result.p is not None:
                qs.extend(r.result.p[: r.n + 1])  # each emitted token was drawn from M_1's row at its position
            if ctx.sequence_ids is not None:  # the positions the level below reads (the loop overwrites them later)
                ctx.sequence_ids[len(prefix): len(prefix) + r.n + 1] = r.result.tokens[: r.n + 1]
            tokens.extend(r.new)
            prefix.extend(r.new)
            emitted.append(r.result.tokens[: r.n + 1])
            pending = r.result.tokens[r.n: r.n + 1]  # [1] M_1's own token: the one its cache lacks
            if r.refused or any(t in ctx.eos_token_ids for t in r.new):
                break  # nothing after an end-of-sequence token (or a complete grammar) can be accepted
        tokens = tokens[:k]
        self._proposed = (len(sequence), len(tokens))
        self.level.new_tokens += len(tokens)
        self.level.time_total += self.clock.seconds(t_start, self.clock.mark())
        if self.copy_first and tokens:
            self._drafted = len(tokens)
            self.draft_times.observe(len(tokens), time.perf_counter() - t_round)
        q = torch.stack(qs[: len(tokens)]) if qs else None
        return Draft(torch.cat(emitted)[: len(tokens)], q) if tokens else Draft.empty(ctx.device)  # [k], never uploaded

    def update(self, n_accepted: int) -> None:
        """Roll back this level, and every level below it to what the level above accepted.

        The levels below were fed this level's whole proposal while it was being drafted; the part
        that the level above rejected must leave their caches too. A copy round leaves M_1 where it was (its
        acceptance is read at the next :meth:`reach`)."""
        if self._drafted:  # betas of one token each up to the first rejection (AlphaEstimate)
            drafted = self._drafted
            self.model_alpha.observe([1.0] * min(n_accepted, drafted) + ([0.0] if n_accepted < drafted else []))
        if self._copying is not None:
            self.copies_accepted += n_accepted
        if self._from_inner or self._copying is not None:  # (a miss in a row, or a hit that resets the count)
            self.misses = self.misses + 1 if n_accepted == 0 else 0
        self._copying = self._drafted = None
        self._from_inner = False
        if self._proposed is not None:
            length, _ = self._proposed
            self.truncate_below(length + n_accepted)
        super().update(n_accepted)

    def truncate(self, length: int) -> None:
        super().truncate(length)
        self.truncate_below(length)

    def truncate_below(self, length: int) -> None:
        if isinstance(self.inner, ModelDrafter):
            self.inner.truncate(length)

    def stats(self) -> DrafterStats:
        """This level's statistics, then the levels' below it."""
        below = self.inner.stats()
        level = self.level.to_dict()
        if self.copy_first:  # copying first: rounds the target verified a copy in, tokens copied and accepted
            level.update(copy_rounds=self.copies, copied_tokens=self.copied, copied_accepted=self.copies_accepted)
        return DrafterStats([level, *below.levels], below.time_convert)

    def close(self) -> None:
        super().close()
        self.inner.close()

    def step_widths(self, gamma: int) -> StepWidths:
        """A level that verifies the level below it runs its pending tokens (the levels above add theirs) plus
        at most gamma - 1 inner drafts: gamma + 1 covers it, narrower steps padded into it. The level below
        is prepared for the same gamma (its pending tokens can be more than two)."""
        return merge_widths({self.model: {1, 2, gamma + 1}}, self.inner.step_widths(gamma))

"""A draft model with another tokenizer than the target's: it drafts text, the target verifies its tokens.

The draft continues the decoded text in its own tokens; the text it adds is encoded with the target's
tokenizer, and the target tokens that text fixes are proposed. A proposal arrives without
probabilities, so the target verifies it with a one-hot q (accept x with probability p(x); on a
rejection sample from p with x removed, renormalized): the output is exactly the target's, greedy or
sampled, whatever the draft's tokenizer (Leviathan et al., Appendix A.1, with q one-hot).

Worked example (target: one token per word, draft: one token per character)::

    target sequence  ["The", " cat"]            text "The cat"
    draft cache      "T" "h" "e" " " "c" "a" "t" (the same text in the draft's tokens)
    the draft adds   " " "s" "a" "t" " " "o" "n" -> new text " sat on"
    target encoding  "The" " cat" | " sat" " on"  -> " on" could still grow (" one"): propose [" sat"]

Only whole target tokens that the drafted text fixes are proposed: the last target token of the
retokenized text is left out while more text may follow it (a draft token that ends mid-word, " o",
never becomes a target token " o"). The committed tokens are the boundary: the new text is encoded
next to the last committed target tokens (an anchor), and used only when the anchor's tokens come
out unchanged (otherwise the new text is encoded on its own).

Between proposals the draft's KV cache keeps the longest prefix of its tokens whose text the
target's decoded text still starts with; only the text after it is re-encoded and fed
(:meth:`RetokenizedDrafter.propose`, step 1). The time spent in the tokenizers is kept in
``convert_seconds`` (reported as ``time_convert`` in :class:`~specdec.stats.GenerationStats`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from specdec.drafters.base import Draft, DraftContext, DrafterStats, StepWidths
from specdec.drafters.model import SessionDrafter
from specdec.errors import SpecDecError
from specdec.models import LanguageModel
from specdec.models.sessions.session import common_prefix_length
from specdec.sampling import argmax, sample, standardize

INCOMPLETE = "\ufffd"  # what a decoder writes for the bytes of a character that is not complete yet
ANCHOR_TOKENS = 2  # committed tokens encoded with new text, so that it is split as it would be in context


def decode_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The exact text of ``ids``: special tokens kept, no clean-up of spaces."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``text`` in ``tokenizer``'s ids, without the special tokens a tokenizer adds around a document."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids a tokenizer puts before a document's text (a BOS token), found by encoding with and without them."""
    with_special = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start: start + len(plain)] == plain:
            return with_special[:start]
    return []


def check_round_trip(tokenizer: Any, text: str, who: str) -> list[int]:
    """``text`` in ``tokenizer``'s ids; a SpecDecError when they do not decode back to ``text``."""
    ids = encode_text(tokenizer, text)
    back = decode_text(tokenizer, ids)
    if back != text:
        at = common_prefix_length(back, text)
        raise SpecDecError(
            f"the tokenizer of {who} cannot round-trip the text: encoding and decoding changes "
            f"{text[at: at + 20]!r} into {back[at: at + 20]!r} (at character {at}). A draft with another tokenizer "
            "than the target's must represent the target's text exactly; use a draft whose tokenizer covers this text"
        )
    return ids


class TokenText:
    """Token ids, the text they decode to, and where each token's text ends.

    ends[i] = len(text of ids[:i + 1]), or -1 when ids[:i + 1] ends inside a character (a byte-level
    token holding part of a UTF-8 sequence): such a position is no text boundary. Each token is
    decoded together with the last complete token before it, whose own text is then cut off
    (decoders may treat the first token of a decode specially: SentencePiece drops its leading space).
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.ends: list[int] = []
        self.text = ""

    def __len__(self) -> int:
        return len(self.ids)

    def is_boundary(self, n: int) -> bool:
        """Whether the text of the first n tokens ends between two characters."""
        return n == 0 or self.ends[n - 1] >= 0

    def end(self, n: int) -> int:
        """Length of the text of the first n tokens (n a boundary)."""
        return 0 if n == 0 else self.ends[n - 1]

    def boundary_at_most(self, chars: int, below: int | None = None) -> int:
        """The largest n (< below, if given) that is a boundary whose text is at most ``chars`` long."""
        n = len(self.ids) if below is None else below - 1
        while n > 0 and not (self.ends[n - 1] >= 0 and self.ends[n - 1] <= chars):
            n -= 1
        return max(n, 0)

    def truncate(self, n: int) -> None:
        """Keep the first n tokens."""
        if n >= len(self.ids):
            return
        b = n
        while not self.is_boundary(b):
            b -= 1
        redo = self.ids[b:n]  # tokens after the last boundary: their text is decoded again
        del self.ids[b:], self.ends[b:]
        self.text = self.text[: self.end(b)]
        self.extend(redo)

    def extend(self, new: Sequence[int]) -> None:
        decode = lambda ids: decode_text(self.tokenizer, ids)  # noqa: E731
        a = len(self.ids) - 1  # the anchor: the last token whose prefix ends on a boundary
        while a >= 0 and self.ends[a] < 0:
            a -= 1
        stem = self.text[: self.ends[a]] if a >= 0 else ""
        base = decode(self.ids[a: a + 1]) if a >= 0 else ""
        text = self.text
        for token in new:
            self.ids.append(int(token))
            window = decode(self.ids[max(a, 0):])
            if a >= 0 and window.startswith(base):
                text = stem + window[len(base):]
            else:
                text = window if a < 0 else decode(self.ids)
            if text.endswith(INCOMPLETE):
                self.ends.append(-1)
            else:
                self.ends.append(len(text))
                a, stem, base = len(self.ids) - 1, text, decode(self.ids[-1:])
        self.text = text

    def sync(self, ids: Sequence[int]) -> None:
        """Become ``ids``: keep the common prefix, decode the rest."""
        keep = common_prefix_length(self.ids, ids)
        self.truncate(keep)
        self.extend(ids[keep:])

    def encode_after(self, n: int, text: str, tries: int = 3) -> tuple[int, list[int]]:
        """The tokens of ``text``, which starts with the text of the first n tokens: (m, new), m <= n.

        The first m tokens stay and ``new`` encodes text[end(m):]. The text is encoded from up to
        ANCHOR_TOKENS tokens before m, so that it is split as in context; when those tokens come out
        changed (the new text merges with them, as " walk" + "ing"), m goes back a token.
        """
        for _ in range(tries):
            if n == 0:
                break
            a = self.boundary_at_most(self.end(n), below=max(n - ANCHOR_TOKENS + 1, 1))
            ids = encode_text(self.tokenizer, text[self.end(a):])
            if ids[: n - a] == self.ids[a:n]:
                return n, ids[n - a:]
            n = self.boundary_at_most(self.end(n), below=n)
        if n > 0:
            return n, encode_text(self.tokenizer, text[self.end(n):])
        return 0, encode_text(self.tokenizer, text)


class RetokenizedDrafter(SessionDrafter):
    """A causal model with its own tokenizer as the draft (see the module docstring).

    model: the draft (any :class:`LanguageModel` with a tokenizer); target_tokenizer: the tokenizer of
    the model its proposals are for. max_draft_ratio: at most this many draft tokens per proposed
    target token (plus 4), a bound for drafts whose text the target tokenizes into few tokens.
    """

    def __init__(self, model: LanguageModel, target_tokenizer: Any, max_draft_ratio: int = 4):
        if getattr(model, "tokenizer", None) is None:
            raise SpecDecError(f"the draft {model.name!r} has no tokenizer: a draft with another vocabulary than the "
                               "target's drafts text, so it needs its tokenizer (specdec.load(model, tokenizer=tok))")
        if target_tokenizer is None:
            raise SpecDecError("the target has no tokenizer: a draft with another vocabulary needs the target's "
                               "tokenizer to turn the drafted text into target tokens")
        self.model = model
        self.name = model.name
        self.target_tokenizer = target_tokenizer
        self.max_draft_ratio = max_draft_ratio
        self.session = None
        self.convert_seconds = 0.0  # time in the tokenizers (decoding, encoding) in this generation
        self._draft_eos = frozenset(model.eos_token_ids)
        self._target_prefix = special_prefix(target_tokenizer)
        self._draft_prefix = special_prefix(model.tokenizer)

    def _skip(self, sequence: Sequence[int]) -> int:
        """How many leading target tokens are the tokenizer's document prefix (BOS), kept out of the text."""
        p = self._target_prefix
        return len(p) if p and list(sequence[: len(p)]) == p else 0

    def start(self, context: DraftContext) -> None:
        super().start(context)
        self.close()
        self.convert_seconds = 0.0
        t0 = time.perf_counter()
        self.target = TokenText(self.target_tokenizer)
        self.target.extend(list(context.prompt_ids)[self._skip(context.prompt_ids):])
        text = self.target.text
        check_round_trip(self.target_tokenizer, text, "the target")
        self.draft = TokenText(self.model.tokenizer)
        self.draft.extend(check_round_trip(self.model.tokenizer, text, f"the draft {self.model.name!r}"))
        self._target_eos = self._pick_target_eos(context)
        self.convert_seconds += time.perf_counter() - t0
        prompt = self._draft_prefix + self.draft.ids
        max_positions = None
        if context.max_positions is not None:
            new_tokens = max(context.max_positions - len(context.prompt_ids), 0)
            max_positions = len(prompt) + self.max_draft_ratio * (new_tokens + 8) + 16
        self.session, _ = self.model.start(prompt, max_positions)
        if len(prompt) > 1:
            self.session.prefill(prompt[:-1])  # the last token is fed by the first proposal

    def stats(self) -> DrafterStats:
        return DrafterStats(time_convert=self.convert_seconds)

    def step_widths(self, gamma: int) -> StepWidths:
        """One token per drafted token after a catch-up of the text the target added: its width varies with
        the tokenizers (a few tokens; a long one runs wider)."""
        return {self.model: {1, 2, 4}}

    def _pick_target_eos(self, context: DraftContext) -> int | None:
        eos = getattr(self.target_tokenizer, "eos_token_id", None)
        if eos in context.eos_token_ids:
            return eos
        return min(context.eos_token_ids) if context.eos_token_ids else None

    def _room(self) -> int:
        """Positions the draft's cache can still take."""
        limits = [n for n in (self.model.max_context, self.session.capacity) if n is not None]
        return min(limits, default=1 << 30) - self.session.length

    def _timed(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.convert_seconds += time.perf_counter() - t0

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        ctx = self.context
        if k <= 0 or self.session is None:
            return Draft.empty(ctx.device)
        target, draft = self.target, self.draft

        # 1. The target's text, and the draft's tokens for it: keep the longest prefix of the draft's
        #    cache whose text the target's text starts with, encode the rest.
        def catch_up() -> list[int] | None:
            target.sync(list(sequence)[self._skip(sequence):])
            if not target.is_boundary(len(target)):
                return None  # the target's text ends inside a character: nothing to continue yet
            kept = draft.boundary_at_most(common_prefix_length(draft.text, target.text))
            kept, new = draft.encode_after(kept, target.text)
            same = common_prefix_length(draft.ids[kept:], new)  # re-encoded tokens the cache already holds
            draft.truncate(kept + same)
            draft.extend(new[same:])
            return kept + same

        valid = self._timed(catch_up)
        ids = self._draft_prefix + draft.ids
        if valid is None or not ids:
            return Draft.empty(ctx.device)
        # the cache keeps what is still valid, and at least one token is fed (for the next token's logits)
        self.session.rollback(min(self.session.length, len(self._draft_prefix) + valid, len(ids) - 1))
        if self._room() < len(ids) - self.session.length + 1:
            return Draft.empty(ctx.device)
        logits = self.session.extend(ids[self.session.length:], 1)[0]  # [V_draft]

        # 2. Draft tokens until their text fixes k target tokens (or ends, or the bound is reached).
        text_before = len(draft.text)
        proposal: list[int] = []
        ended = False
        for step in range(self.max_draft_ratio * k + 4):
            if step > 0:
                if self._room() < 2:
                    break
                logits = self.session.extend([draft.ids[-1]], 1)[0]
            x = self._pick(logits)
            if x is None:
                break  # the confidence schedule: the draft is unsure
            if x in self._draft_eos:
                ended = True
                break
            self._timed(lambda: draft.extend([x]))
            if not draft.is_boundary(len(draft)):
                continue  # the draft's text ends inside a character
            tokens = self._timed(lambda: self._target_tokens(draft.text[text_before:]))
            if tokens is None:
                break
            proposal = tokens
            if len(tokens) > k:
                break
        # 3. The fixed target tokens: all but the last, unless the draft's text ended there; none past
        #    the target's width (a tokenizer may know more tokens than the model has logits for).
        if ended:
            if self._target_eos is not None:
                proposal = proposal + [self._target_eos]
        else:
            proposal = proposal[:-1]
        proposal = proposal[:k]
        outside = [i for i, x in enumerate(proposal) if not 0 <= x < ctx.vocab_size]
        return Draft.from_ids(proposal[: outside[0]] if outside else proposal, ctx.device)

    def _pick(self, logits: torch.Tensor) -> int | None:
        """The next draft token, standardized as the target is (argmax when greedy); None when unsure."""
        ctx = self.context
        if ctx.sampling.greedy:
            if ctx.stop_below is not None and torch.softmax(logits.float(), -1).max() < ctx.stop_below:
                return None
            return int(argmax(logits))
        q = standardize(logits, ctx.sampling)  # [V_draft]
        if ctx.stop_below is not None and q.max() < ctx.stop_below:
            return None
        return int(sample(q, ctx.generator))

    def _target_tokens(self, text: str) -> list[int] | None:
        """Target tokens of ``text`` following the target's committed sequence (None: they cannot be found).

        The text is encoded after the last committed tokens (the anchor); when the anchor's tokens come
        out changed (the text merges with the last committed token), the text is encoded on its own, and
        used when it decodes back to itself.
        """
        target = self.target
        n = len(target)
        if n > 0:
            a = target.boundary_at_most(target.end(n), below=max(n - ANCHOR_TOKENS + 1, 1))
            ids = encode_text(self.target_tokenizer, target.text[target.end(a):] + text)
            if ids[: n - a] == target.ids[a:n]:
                return ids[n - a:]
        ids = encode_text(self.target_tokenizer, text)
        return ids if decode_text(self.target_tokenizer, ids) == text else None

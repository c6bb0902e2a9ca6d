"""One generation's place in its grammar: which tokens may come next, after the sequence and after each drafted token.

The constraint is part of the standardized distribution (paper Section 2.2): the target's logits at a position are
masked to the tokens the grammar allows after everything before that position (disallowed logits become -inf)
before temperature, top-k and top-p; the draft's at the same position get the same mask. Speculative sampling
over the masked p and q is then exact for the constrained law, the same law plain constrained decoding samples.

Depths: depth 0 is the committed sequence; depth d the sequence plus the round's first d drafted tokens
(``pushed[:d]``). A round pushes its drafts (each depth's mask is computed once, when the depth is first
reached: verification needs them all), settles on what the target emitted (the matcher rolls back the
rejected drafts: llguidance's rollback), and commits. A draft token the grammar refuses ends the draft there:
for a one-hot q (prompt lookup, a greedy draft) the target would reject it with certainty, and a sampled draft's
kept tokens are then drawn from its q masked and renormalized, which :meth:`Constraint.admit` hands to
verification, so both stay exact.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from specdec.constraints.grammar import Grammar, llguidance_module
from specdec.drafters.base import Draft
from specdec.errors import SpecDecError


def ll_tokenizer(model: Any) -> Any:
    """llguidance's view of ``model``'s tokenizer (built once per model: about a second for a 150k vocabulary).

    Byte-level BPE tokenizers go through llguidance's own reader; any other (word-level, say) is described
    token by token (each id's decoded text)."""
    cached = getattr(model, "_ll_tokenizer", None)
    if cached is not None:
        return cached
    ll = llguidance_module()
    import llguidance.hf

    tokenizer = model.tokenizer
    n_vocab = max(int(model.vocab_size), len(tokenizer))
    eos = sorted(model.eos_token_ids) or None
    try:
        out = llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos)
    except ValueError:  # not a byte-level tokenizer llguidance can read: list each token's text
        out = ll.LLTokenizer(ll.TokenizerWrapper(_TokenTable(tokenizer, n_vocab, eos)), n_vocab=n_vocab, eos_token=eos)
    model._ll_tokenizer = out
    return out


class _TokenTable:
    """What llguidance's TokenizerWrapper reads from a tokenizer it cannot parse: each id's bytes and an encoder."""

    def __init__(self, tokenizer: Any, n_vocab: int, eos: list[int] | None):
        special = set(tokenizer.all_special_ids)
        # llguidance marks a special token by a leading 0xFF byte; ids past the tokenizer (padding) get one too
        self.tokens = [b"\xff" + f"<special_{i}>".encode() if i in special or i >= len(tokenizer)
                       else tokenizer.decode([i]).encode("utf-8") for i in range(n_vocab)]
        self.special_token_ids = sorted(special)
        self.eos_token_id = (eos or [tokenizer.eos_token_id])[0]
        self.bos_token_id = tokenizer.bos_token_id
        self.is_tokenizer_wrapper = True
        self._ids = {b: i for i, b in reversed(list(enumerate(self.tokens))) if b and not b.startswith(b"\xff")}
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: bytes | str) -> list[int]:
        """Greedy longest-match over the table (what llguidance needs to tokenize forced bytes; the tokenizer's own
        encoder need not round-trip arbitrary byte strings)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out, at = [], 0
        while at < len(data):
            for size in range(min(self._longest, len(data) - at), 0, -1):
                token = self._ids.get(data[at: at + size])
                if token is not None:
                    out.append(token)
                    at += size
                    break
            else:
                at += 1  # a byte no token starts with: skipped (such text cannot be generated anyway)
        return out


class Constraint:
    """The allowed next tokens at each depth of one generation (see the module docstring).

    vocab_size: V, the width of the logits the masks apply to (a padded embedding table's extra ids are never
    allowed). length: how long the committed sequence is (a drafter proposing after a sequence of length m
    works at depth m - length: :meth:`depth_of`). Statistics: ``mask_seconds`` and ``masks`` (host time computing
    allowed sets, and how many).
    """

    def __init__(self, grammar: Grammar, model: Any, length: int = 0, device: torch.device | str = "cpu"):
        ll = llguidance_module()
        self.length = length  # the committed sequence's length (depth 0)
        self.grammar = grammar
        self.vocab_size = int(model.vocab_size)
        self.device = torch.device(device)
        self._tokenizer = ll_tokenizer(model)
        self.matcher = ll.LLMatcher(self._tokenizer, grammar.compiled, log_level=0)
        self._history: list[int] = []  # the committed tokens the matcher was fed (to rebuild it after a dead end)
        self.dead_end = False  # the committed text ends where no token can continue the grammar
        if self.matcher.is_error():
            raise SpecDecError(f"{grammar.label} cannot be used with {model.name}'s tokenizer: "
                               f"{self.matcher.get_error()}")
        self.eos = frozenset(model.eos_token_ids)
        # llguidance's end tokens that are not the model's (a model without one: the tokenizer's) are never allowed
        self._not_ends = sorted(set(self._tokenizer.eos_tokens) - self.eos)
        self.pushed: list[int] = []  # drafted tokens beyond the committed sequence
        # An end-of-sequence token is checked against the mask but never fed to the matcher (nothing follows it,
        # and a stopped matcher does not roll back token for token): the matcher holds the others only.
        self._fed: list[bool] = []
        self._host: list[np.ndarray] = []  # [W] int32 bitmask per depth 0..len(pushed)
        self._device: dict[int, torch.Tensor] = {}  # depth -> [V] bool on the device (made when asked)
        self.mask_seconds = 0.0
        self.masks = 0
        self._compute()
        if self.matcher.is_error() or not self._host[0].any():
            raise SpecDecError(f"{grammar.label} cannot be expressed with {model.name}'s tokenizer: no token can "
                               "start it")

    def depth_of(self, sequence_length: int) -> int:
        """The depth of a sequence of this length (the committed one plus what is pushed of the round)."""
        depth = sequence_length - self.length
        if not 0 <= depth <= len(self.pushed):
            raise RuntimeError(f"a sequence of length {sequence_length} is not at a known depth (committed "
                               f"{self.length}, pushed {len(self.pushed)})")
        return depth

    # -- the allowed sets --------------------------------------------------------------------------------------
    def _compute(self) -> None:
        """The bitmask after everything consumed so far (the depth just reached)."""
        t0 = time.perf_counter()
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.int32)  # [W]: bit t of word t // 32
        if self._not_ends:
            bits = bits.copy()
            for t in self._not_ends:
                bits[t >> 5] &= np.int32(~(1 << (t & 31)) if (t & 31) < 31 else 0x7FFFFFFF)
        self.mask_seconds += time.perf_counter() - t0
        self.masks += 1
        self._host.append(bits)

    def allows(self, depth: int, token: int) -> bool:
        """Whether ``token`` may follow depth ``depth`` (0 <= depth <= len(pushed))."""
        if not 0 <= token < self.vocab_size:
            return False
        return bool((int(self._host[depth][token >> 5]) >> (token & 31)) & 1)

    def allowed(self, depth: int) -> torch.Tensor:
        """[V] bool on the device: the tokens allowed after depth ``depth``."""
        mask = self._device.get(depth)
        if mask is None:
            words = self._host[depth]
            if self.device.type == "cpu":
                bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size]
                mask = torch.from_numpy(bits.astype(bool))
            else:  # upload the words, expand on the device
                w = torch.from_numpy(words.copy()).to(self.device, non_blocking=True)  # [W]
                shifts = torch.arange(32, device=self.device, dtype=torch.int32)
                mask = ((w[:, None] >> shifts) & 1).bool().reshape(-1)[: self.vocab_size]
            self._device[depth] = mask
        return mask

    def restrict(self, logits: torch.Tensor, depth: int) -> torch.Tensor:
        """``logits`` [V] or [rows, V] with row i masked by the allowed set after depth + i (-inf elsewhere)."""
        if logits.dim() == 1:
            return logits.masked_fill(~self.allowed(depth), float("-inf"))
        masks = torch.stack([self.allowed(depth + i) for i in range(logits.shape[0])])  # [rows, V]
        return logits.masked_fill(~masks, float("-inf"))

    # -- moving through the grammar ------------------------------------------------------------------------------
    def _rollback_to(self, depth: int) -> None:
        if len(self.pushed) > depth:
            fed = sum(self._fed[depth:])
            if fed and not self.matcher.rollback(fed):  # pragma: no cover - llguidance keeps what it consumed
                raise SpecDecError(f"the grammar matcher could not roll back {fed} tokens: {self.matcher.get_error()}")
            del self.pushed[depth:], self._fed[depth:], self._host[depth + 1:]
            for d in [d for d in self._device if d > depth]:
                del self._device[d]

    def push(self, depth: int, token: int) -> bool:
        """Place ``token`` at depth ``depth`` (after pushed[:depth]); False, and nothing changed beyond ``depth``,
        when the grammar refuses it there. Pushing what is already there reuses its mask."""
        if len(self.pushed) > depth and self.pushed[depth] == token:
            return True
        self._rollback_to(depth)
        if not self.allows(depth, token):
            return False
        self.pushed.append(token)
        if token in self.eos:  # the end: nothing is allowed after it
            self._fed.append(False)
            self._host.append(np.zeros_like(self._host[depth]))
            return True
        if not self.matcher.consume_token(token):  # pragma: no cover - the mask said it was allowed
            raise SpecDecError(f"the grammar matcher refused token {token} that its mask allowed: "
                               f"{self.matcher.get_error()}")
        self._fed.append(True)
        self._compute()
        if self.matcher.is_error():  # a dead end: allowed, but no token can follow it (an error llguidance keeps)
            self._rebuild(depth)
            self._fed[-1] = False
            self._host[-1] = np.zeros_like(self._host[-1])
        return True

    def _rebuild(self, depth: int) -> None:
        """A fresh matcher fed the committed tokens and pushed[:depth] (a matcher in error never rolls back)."""
        ll = llguidance_module()
        self.matcher = ll.LLMatcher(self._tokenizer, self.grammar.compiled, log_level=0)
        fed = self._history + [t for t, f in zip(self.pushed[:depth], self._fed[:depth]) if f]
        if fed and not self.matcher.consume_tokens(fed):  # pragma: no cover - they were taken before
            raise SpecDecError(f"the grammar matcher could not replay its tokens: {self.matcher.get_error()}")

    def admit(self, proposal: Draft, depth: int = 0) -> Draft:
        """The longest prefix of ``proposal`` (drafted after depth ``depth``) the grammar allows, pushed, with its q
        masked and renormalized (see the module docstring): the draft verification sees. One read-back of the ids."""
        if not len(proposal):
            self._rollback_to(depth)
            return proposal
        ids = proposal.tokens.tolist()
        keep = 0
        while keep < len(ids) and self.push(depth + keep, int(ids[keep])):
            keep += 1
        self._rollback_to(depth + keep)
        q = proposal.q
        if q is not None and keep:
            masks = torch.stack([self.allowed(depth + i) for i in range(keep)])  # [keep, V]
            q = q[:keep] * masks
            q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
        elif q is not None:
            q = None
        return Draft(proposal.tokens[:keep], q)

    def settle(self, depth: int, emitted: list[int]) -> int:
        """The round verified at ``depth`` and emitted ``emitted`` (accepted drafts, then the target's token):
        keep them pushed, drop the rejected drafts. Returns how many the grammar allows (all of them, except where
        the grammar was complete and the model has no end-of-sequence token the mask could allow)."""
        ok = 0
        while ok < len(emitted) and self.push(depth + ok, int(emitted[ok])):
            ok += 1
        self._rollback_to(depth + ok)
        return ok

    def commit(self) -> None:
        """The pushed tokens are now part of the sequence: depth 0 moves to the end of them."""
        n = len(self.pushed)
        if n:
            self.length += n
            self._history += [t for t, f in zip(self.pushed, self._fed) if f]
            self.dead_end = not self._fed[-1] and self.pushed[-1] not in self.eos
            self.pushed, self._fed = [], []
            self._host = self._host[n:]
            self._device = {d - n: m for d, m in self._device.items() if d >= n}
            # llguidance keeps the consumed tokens for rollback; the committed ones are never rolled back

    def forced(self) -> list[int]:
        """The tokens the grammar forces after the committed sequence (llguidance's fast-forward tokens): the
        grammar's own draft. Empty while drafts are pushed or where the next token is a choice."""
        if self.pushed or self.matcher.is_stopped():
            return []
        return list(self.matcher.compute_ff_tokens())

    @property
    def complete(self) -> bool:
        """The committed text is a complete match (the grammar accepts it as it is)."""
        return not self.dead_end and (bool(self.matcher.is_accepting()) or self.matcher.is_stopped())

    @property
    def finished(self) -> bool:
        """Nothing may follow the committed sequence (not even an end-of-sequence token)."""
        return not self._host[0].any()

    def report(self) -> dict[str, Any]:
        return {**self.grammar.to_dict(), "complete": self.complete, "masks": self.masks,
                "mask_seconds": self.mask_seconds}

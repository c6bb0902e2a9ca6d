"""One speculative round (Algorithm 1, one iteration) over a model session: the loop of a generation, and the
same round one level down inside a hierarchy (a draft model verifying a cheaper draft).

    draft k tokens  ->  one forward pass over [pending + drafts]  ->  verify  ->  one read-back
    ->  roll the session back to the sequence + accepted drafts  ->  tell the drafter how many it got

The caller owns the sequence (host ids), the statistics (named for its level: ``GenerationStats`` for the
target, ``LevelStats`` for a level of a hierarchy) and what happens to the emitted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specdec.acceptance import Verification, verify
from specdec.devices import RoundClock
from specdec.drafters.base import Draft, Drafter
from specdec.drafters.model import fit_width
from specdec.sampling import SamplingParams


@dataclass
class Round:
    """What one round did. new: the emitted tokens (n accepted drafts, then the verifier's token);
    betas: the verified positions' beta; times in seconds (the draft's proposal; the verifier's pass and
    the acceptance test)."""

    proposal: Draft
    result: Verification
    new: list[int]
    n: int
    betas: list[float]
    draft_calls: int
    time_draft: float
    time_verify: float
    refused: bool = False  # under a constraint: the grammar was complete and allowed no token, not even EOS

    @property
    def drafted(self) -> int:
        return len(self.proposal)


def with_carried(carried: torch.Tensor | None, logits: torch.Tensor | None) -> torch.Tensor:
    """A round's verification logits [g + 1, V]: ``carried`` [1, V] (the last position's, from the pass that
    cached it; None: none) before ``logits`` [g, V] of the drafts (None or empty: no pass, nothing drafted)."""
    if carried is None:
        return logits
    if logits is None or len(logits) == 0:
        return carried
    return torch.cat([carried, logits])


def speculative_round(session: Any, drafter: Drafter | None, sequence: Sequence[int], k: int, pending: torch.Tensor,
                      sampling: SamplingParams, generator: torch.Generator, clock: RoundClock, *,
                      width: int | None = None, lenience: float = 1.0, verification: str = "token",
                      carried: torch.Tensor | None = None, constraint: Any = None) -> Round:
    """One round: ``drafter`` proposes up to ``k`` tokens continuing ``sequence`` (k = 0 or no drafter: a plain
    step); the session's model scores ``pending`` (the tokens of ``sequence`` it has not seen, [m] long on the
    device) and the drafts in one pass; the drafts are verified (``acceptance.verify``) and read back once;
    the session keeps ``sequence`` and the accepted drafts, not the verifier's own new token.

    width: cut or pad the verifier's logits to this vocabulary width (a hierarchy level's model may pad its
    embedding table differently from the target's).
    carried: the logits [1, V] of the sequence's last position, from the pass that cached it (the prefill,
    which covers the whole prompt: the first round of a generation), with ``pending`` empty: the pass then
    covers the drafts only, and a plain first step makes no pass at all (as transformers' and llama.cpp's
    first token comes from their prefill).
    constraint: a :class:`specdec.constraints.Constraint` (structured output): the drafts are cut at the first
    token the grammar refuses (:meth:`~specdec.constraints.Constraint.admit`), every verified position's logits
    are masked to what the grammar allows there, and the emitted tokens stay pushed (the caller commits them).
    """
    t0 = clock.mark()
    if k > 0 and drafter is not None:
        before = drafter.forward_passes
        proposal = drafter.propose(sequence, k)
        draft_calls = drafter.forward_passes - before
    else:
        proposal, draft_calls = Draft.empty(pending.device), 0
    depth = constraint.depth_of(len(sequence)) if constraint is not None else 0
    if constraint is not None:
        proposal = constraint.admit(proposal, depth)
    t1 = clock.mark()
    g = len(proposal)
    fed = torch.cat([pending, proposal.tokens])  # [m + g]
    wanted = g + (carried is None)  # the last pending token's logits and the drafts'; carried holds the former
    logits = with_carried(carried, session.extend(fed, wanted) if len(fed) else None)  # [g + 1, V]
    if width is not None:
        logits = fit_width(logits, width)
    if constraint is not None:
        logits = constraint.restrict(logits, depth)  # [g + 1, V]
    result = verify(logits, proposal.tokens, proposal.q, sampling, generator, lenience, verification)
    t2 = clock.mark()
    new, n, betas = result.read()  # the round's one synchronization
    refused = constraint is not None and constraint.settle(depth, new) < len(new)
    if refused:  # only the target's token can be refused (the drafts were admitted): the grammar is complete
        new = new[:n]
    session.rollback(len(sequence) + n)  # the sequence and the accepted drafts, not the new token
    if drafter is not None:
        drafter.update(n)  # after a plain step too (n = 0 of nothing drafted)
    return Round(proposal, result, new, n, betas, draft_calls, clock.seconds(t0, t1), clock.seconds(t1, t2), refused)


def check_dead_end(run: Any, new: list[int]) -> None:
    """After a round's tokens were committed to ``run.constraint``: the error for a text the grammar allowed but no
    token of the tokenizer can continue (the one-sequence loop's and a batch row's)."""
    constraint = run.constraint
    if constraint is not None and constraint.dead_end:
        from specdec.errors import SpecDecError

        raise SpecDecError(f"{constraint.grammar.label} cannot be completed with {run.target.name}'s tokenizer after "
                           f"{run.target.decode(run.sequence[run.start_len:] + new)!r}: no token can continue it")

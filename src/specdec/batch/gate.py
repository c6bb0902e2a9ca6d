"""Whether a batch's draft model drafts this round: speculation in a batch only while it pays, measured.

One row's speculation gains what Theorem 8 says; B rows share a target pass over B (gamma + 1) tokens, which
costs more than one over B tokens once the pass stops being bound by reading the weights (docs/serving.md: v_8 =
2.9 on a 2-core CPU), so past a few rows plain batching yields more tokens a second than drafting does. A cost
model of that (:class:`~specdec.schedules.BatchGamma`) leaves out what the model draft costs besides its steps
(its catch-up after plain rounds, its passes' padding); this gate measures instead: for each batch size B it keeps
the decayed tokens a second of the rounds that drafted and of those that did not (every row's tokens, the
whole round's wall time: drafting, verification, the engine's bookkeeping), tries each at a new B, then drafts
while drafting's rate is at least plain's, and tries the other side every ``probe_every`` rounds. The first
round after a switch is not counted (a draft's first round after plain ones first catches up with their tokens).

A batch of one row drafts as its schedule says (it runs alone through the one-sequence engine where it can,
:mod:`specdec.batch.alone`): no gate there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from specdec.batch.row import MODEL

GATE_DECAY = 0.8  # weight of the past in each rate (rates drift as sequences grow)
GATE_TRIALS = 2  # counted rounds of each side at a new batch size before the better one is chosen
GATE_PROBE_EVERY = 24  # rounds between two tries of the side not chosen


@dataclass
class _Side:
    rate: float = 0.0  # decayed tokens a second
    rounds: int = 0  # counted rounds

    def observe(self, rate: float, decay: float) -> None:
        self.rate = rate if not self.rounds else decay * self.rate + (1 - decay) * rate
        self.rounds += 1


@dataclass
class DraftGate:
    """Per batch size: drafting's and plain rounds' measured rates, and the side each round takes."""

    decay: float = GATE_DECAY
    trials: int = GATE_TRIALS
    probe_every: int = GATE_PROBE_EVERY
    labels: tuple[str, str] = ("drafting", "plain")  # the two sides' names in reports (True first)
    sides: dict[tuple[int, bool], _Side] = field(default_factory=dict)  # (rows, drafts) -> its rate
    _last: bool | None = None  # the previous round's side (None: none yet)
    _since_probe: dict[int, int] = field(default_factory=dict)  # rows -> rounds since the other side was tried
    _probing: int = 0  # rounds left of a probe of the other side

    def side(self, rows: int, drafts: bool) -> _Side:
        return self.sides.setdefault((rows, drafts), _Side())

    def settled(self, rows: int) -> bool | None:
        """The better side at ``rows`` rows once both were tried (None: not yet)."""
        spec, plain = self.sides.get((rows, True)), self.sides.get((rows, False))
        if spec is None or plain is None or min(spec.rounds, plain.rounds) < self.trials:
            return None
        return spec.rate >= plain.rate

    def drafts(self, rows: int) -> bool:
        """Whether the model draft drafts in this round of ``rows`` rows."""
        better = self.settled(rows)
        if better is None:  # a new batch size: what a settled neighbour says (speculation pays less with more
            # rows: plain at fewer rows is plain here, drafting at more rows is drafting here), else try both sides
            known = {r: self.settled(r) for r, _ in self.sides if r != rows}
            if any(b is False for r, b in known.items() if r < rows):
                better = False
            elif any(b for r, b in known.items() if r > rows):
                better = True
            else:
                spec, plain = self.side(rows, True), self.side(rows, False)
                return spec.rounds < self.trials or plain.rounds >= self.trials  # drafting first, then plain
        if self._probing:
            self._probing -= 1
            return not better
        self._since_probe[rows] = self._since_probe.get(rows, 0) + 1
        if self._since_probe[rows] >= self.probe_every:
            self._since_probe[rows] = 0
            self._probing = 1  # this round and the next: the first one is not counted (a switch)
            return not better
        return better

    def observe(self, rows: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A round of ``rows`` rows that ``drafted`` (or not) gave ``tokens`` tokens in ``seconds``."""
        switched = self._last is not None and self._last != drafted
        self._last = drafted
        if switched or seconds <= 0:
            return
        self.side(rows, drafted).observe(tokens / seconds, self.decay)

    def report(self) -> dict:
        return {f"{rows} {self.labels[0] if d else self.labels[1]}": round(s.rate, 3)
                for (rows, d), s in sorted(self.sides.items())}


def gate_round(gate: DraftGate | None, rows: list[Any], ks: list[int]) -> tuple[list[int], Callable[[], None] | None]:
    """This round's gammas under ``gate`` (None: no gate, or no draft model): the model-drafted rows' set to 0 where
    the gate says plain; and what to call once the round is done (its tokens and time to the gate), or None
    where the gate had nothing to decide (no row wanted the model to draft)."""
    if gate is None or len(rows) < 2 or not any(row.draft == MODEL and k > 0 for row, k in zip(rows, ks)):
        return ks, None  # (one row drafts as its schedule says, as it would alone: Theorem 8's own case)
    if not gate.drafts(len(rows)):  # plain rounds yield more at this batch size (measured)
        ks = [0 if row.draft == MODEL else k for row, k in zip(rows, ks)]
    drafts = any(k > 0 for row, k in zip(rows, ks) if row.draft == MODEL)
    before, started = sum(len(row.sequence) for row in rows), time.perf_counter()

    def done() -> None:
        gate.observe(len(rows), drafts, sum(len(row.sequence) for row in rows) - before, time.perf_counter() - started)

    return ks, done

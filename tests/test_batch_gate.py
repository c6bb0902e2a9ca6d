"""The batch's draft gate (specdec.batch.gate): at each batch size the draft model drafts while its measured rounds
give at least plain rounds' tokens a second, tries both sides first, probes the other now and then, and does not
count the round after a switch; greedy rows stay exact whatever it decides."""

import specdec
from specdec.batch.gate import DraftGate
from specdec.batch.engine import BatchEngine
from specdec.config import GenerationConfig
from test_batching import PROMPTS
from test_quantize import quantized_copy
from tiny import load_tiny, perturbed


def run(gate: DraftGate, rows: int, rates: dict[bool, float], rounds: int) -> list[bool]:
    """``rounds`` rounds at ``rows`` rows where drafting / plain rounds give these tokens a second."""
    sides = []
    for _ in range(rounds):
        drafts = gate.drafts(rows)
        gate.observe(rows, drafts, round(rates[drafts] * 0.1), 0.1)
        sides.append(drafts)
    return sides


def test_the_gate_tries_both_sides_then_keeps_the_faster_and_probes_the_other():
    gate = DraftGate(probe_every=10)
    sides = run(gate, 8, {True: 60.0, False: 100.0}, 60)  # 8 rows: plain batching yields more
    assert sides[:2] == [True, True] and False in sides[2:5]  # drafting first (the default), then plain
    settled = sides[8:]
    assert settled.count(True) <= len(settled) // 5 and settled.count(True) >= 2  # plain, with probes
    assert gate.side(8, False).rate == 100.0 and gate.side(8, True).rate == 60.0
    two = run(gate, 2, {True: 80.0, False: 50.0}, 40)  # 2 rows: drafting pays; its own measurements
    assert two[6:].count(True) >= len(two[6:]) * 0.8
    assert gate.report() == {"2 drafting": 80.0, "2 plain": 50.0, "8 drafting": 60.0, "8 plain": 100.0}


def test_a_settled_batch_size_decides_for_its_neighbours():
    """Speculation pays less as rows are added: plain settled at 4 rows is plain at 6 without trying, drafting
    settled at 4 is drafting at 2; between settled sizes that disagree nothing is inferred."""
    gate = DraftGate(probe_every=1000)
    run(gate, 4, {True: 40.0, False: 60.0}, 12)
    assert gate.settled(4) is False and gate.drafts(6) is False and gate.side(6, True).rounds == 0
    other = DraftGate(probe_every=1000)
    run(other, 4, {True: 70.0, False: 60.0}, 12)
    assert other.settled(4) is True and other.drafts(2) is True and other.side(2, False).rounds == 0
    assert other.drafts(6) is True  # no settled size below says plain: it tries, drafting first


def test_the_round_after_a_switch_is_not_counted():
    gate = DraftGate()
    gate.observe(4, True, 10, 0.1)  # 100 tok/s
    gate.observe(4, False, 1, 0.1)  # a switch: not counted (it would be 10 tok/s)
    gate.observe(4, False, 5, 0.1)
    assert gate.side(4, False).rounds == 1 and gate.side(4, False).rate == 50.0


def test_a_gated_batch_stays_exact_and_drafts_less_where_the_draft_is_dear():
    """The draft is the target itself (a step costs a target step): at four rows plain rounds win, and the gate
    drafts in a minority of rounds; the greedy rows are still the target's own tokens."""
    target = quantized_copy(load_tiny(eos=None, hidden=128), "int8")
    configs = [GenerationConfig(max_new_tokens=40, gamma=4) for _ in range(4)]
    engine = BatchEngine(target, target, max_batch=4, speculation="gate")
    rows = [engine.add(p, c) for p, c in zip(PROMPTS[:4], configs)]
    engine.run()
    assert [r.output.token_ids for r in rows] == [specdec.generate(target, p, config=c).token_ids
                                                   for p, c in zip(PROMPTS[:4], configs)]
    plain, drafting = engine.gate.side(4, False), engine.gate.side(4, True)
    assert plain.rounds >= 2 and drafting.rounds >= 2
    ungated = BatchEngine(target, target, max_batch=4)  # (the default: no gate)
    rows = [ungated.add(p, c) for p, c in zip(PROMPTS[:4], configs)]
    ungated.run()
    assert ungated.gate is None and all(r.output.stats.drafted > 0 for r in rows)

"""Batched speculative decoding (specdec.batch.engine): every row is what specdec.generate gives it alone."""

import pytest
import torch

import specdec
from specdec.batch.engine import MODEL, BatchEngine, BatchGamma
from specdec.config import GenerationConfig
from specdec.models.sessions.batch_session import BatchSession
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import PROMPT as DIST_PROMPT, V, exact_joint
from test_quantize import quantized_copy
from tiny import load_tiny, perturbed, tiny_gemma3

PROMPTS = [[1, 10, 11, 12], [1, 13, 14, 15, 16, 17, 18], [1, 20], [1, 10, 11, 12, 13, 14, 10, 11],
           [1, 21, 22, 23, 21, 22], [1, 30, 31], [1, 12, 12, 12, 12, 12, 12, 12, 12, 12], [1, 40, 41, 42, 43]]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def pair(request):
    target = tiny_gemma3(sliding_window=4, eos=None) if request.param == "gemma3" else load_tiny(eos=None)
    return target, perturbed(target, 0.05)


def mixed_configs():
    """Eight rows of different lengths, schedules and stops (greedy)."""
    return [GenerationConfig(max_new_tokens=n, gamma=g, gamma_schedule=s)
            for n, g, s in [(20, 4, "constant"), (7, 2, "constant"), (33, 6, "adaptive"), (12, 3, "heuristic"),
                            (25, 4, "confidence"), (1, 4, "constant"), (18, 5, "adaptive"), (29, 1, "constant")]]


@pytest.mark.parametrize("draft_kind", ["model", "prompt-lookup", "bigram", "none"])
def test_greedy_rows_equal_their_generation_alone(pair, draft_kind):
    target, model = pair
    draft = {"model": model, "none": None}.get(draft_kind, draft_kind)
    configs = mixed_configs()
    alone = [specdec.generate(target, p, draft=draft, config=c) for p, c in zip(PROMPTS, configs)]
    outs = specdec.generate_batch(target, PROMPTS, draft=draft, configs=configs)  # (the batch's gamma: measured)
    for i, (out, ref) in enumerate(zip(outs, alone)):
        assert out.token_ids == ref.token_ids, (draft_kind, i)
        assert out.stats.stop_reason == ref.stats.stop_reason
        assert out.prompt_ids == PROMPTS[i] and out.text == ref.text
    if draft_kind == "model":
        assert sum(o.stats.accepted for o in outs) > 0 and sum(o.stats.drafted for o in outs) > 0
    # fewer rows than prompts: rows join as others finish (continuous batching), same tokens
    joined = specdec.generate_batch(target, PROMPTS, draft=draft, configs=configs, max_batch=3, speculation="rows")
    assert [o.token_ids for o in joined] == [o.token_ids for o in alone]


def test_plain_and_speculative_rows_share_a_batch_and_stop_strings_and_eos_end_rows():
    target = load_tiny()  # with its EOS
    model = perturbed(target, 0.05)
    engine = BatchEngine(target, model, max_batch=4, speculation="rows")
    stop_word = target.decode(specdec.generate(target, PROMPTS[1], max_new_tokens=6).token_ids[3:4]).strip()
    requests = [(PROMPTS[0], GenerationConfig(max_new_tokens=40), MODEL),
                (PROMPTS[1], GenerationConfig(max_new_tokens=40, stop=[stop_word]), None),
                (PROMPTS[2], GenerationConfig(max_new_tokens=40, seed=5, temperature=0.9), "prompt-lookup"),
                (PROMPTS[3], GenerationConfig(max_new_tokens=40, gamma=3), MODEL)]
    rows = [engine.add(p, c, draft=d) for p, c, d in requests]
    streamed = {i: [] for i in range(4)}
    for i, row in enumerate(rows):
        row.on_tokens = lambda ids, origins, i=i: streamed[i].extend(ids)
    engine.run()
    for i, ((prompt, config, draft), row) in enumerate(zip(requests, rows)):
        ref = specdec.generate(target, prompt, draft=model if draft == MODEL else draft, config=config)
        if config.temperature == 0:
            assert row.output.token_ids == ref.token_ids, i
        assert streamed[i] == row.output.token_ids  # each row streams its own tokens
    assert rows[1].output.stats.stop_reason == "stop" and stop_word not in rows[1].output.text
    assert rows[1].output.stats.drafted == 0  # the plain row drafted nothing beside speculative rows
    assert engine.passes and max(r for r, _ in engine.passes) == 4  # one pass over all rows per round


def test_a_rows_first_token_comes_from_its_prefill():
    """A joining row's prefill covers its whole prompt and gives its first token: two plain rows of 6 tokens
    need 5 batched passes after their prefills, and each equals its generate output."""
    target = load_tiny(eos=None)
    engine = BatchEngine(target, max_batch=2)
    rows = [engine.add(p, GenerationConfig(max_new_tokens=6)) for p in PROMPTS[:2]]
    engine.run()
    assert engine.passes == [(2, 1)] * 5
    for row, prompt in zip(rows, PROMPTS):
        assert row.output.token_ids == specdec.generate(target, prompt, max_new_tokens=6).token_ids


def test_rows_never_leak_into_each_other():
    """A row whose draft is perfect (the target itself) beside one whose draft is always wrong (random
    tokens): each keeps its own acceptance and its own output."""
    target = load_tiny(eos=None)
    engine = BatchEngine(target, target, max_batch=2, speculation="rows")  # the draft model is the target: a perfect draft
    perfect = engine.add(PROMPTS[0], GenerationConfig(max_new_tokens=30, gamma=4), draft=MODEL)
    wrong = engine.add(PROMPTS[1], GenerationConfig(max_new_tokens=30, gamma=4), draft="random")
    engine.run()
    assert perfect.output.stats.acceptance_rate == 1.0  # every drafted token accepted, round after round
    assert perfect.output.stats.target_calls == 6  # 5 tokens per call: 4 drafts + the bonus
    assert wrong.output.stats.acceptance_rate < 0.2
    for row, prompt in ((perfect, PROMPTS[0]), (wrong, PROMPTS[1])):
        assert row.output.token_ids == specdec.generate(target, prompt, max_new_tokens=30).token_ids


@pytest.mark.parametrize("speculation", ["rows", "measured"])
def test_rows_follow_the_target_distribution_at_temperature_one(speculation):
    """T > 0 end to end: two settings of the same prompt, sampled in batches beside rows of other prompts,
    settings and lengths (rows join and leave continuously); the first two tokens of each setting follow
    the target's exact joint distribution (chi-square, as tests/test_distribution.py), whether each row drafts as
    its schedule says or as the batch's measured costs cap it."""
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    draft = perturbed(target, 1.0, seed=3)
    settings = {"t1": dict(temperature=1.0, gamma=3, max_new_tokens=5),
                "topk": dict(temperature=0.7, top_k=5, top_p=0.9, gamma=2, max_new_tokens=4)}
    others = [dict(temperature=0.0, max_new_tokens=9), dict(temperature=1.3, max_new_tokens=3, gamma=1),
              dict(temperature=1.0, max_new_tokens=7, gamma_schedule="adaptive")]
    engine = BatchEngine(target, draft, max_batch=12, speculation=speculation)
    rows: dict[str, list] = {name: [] for name in settings}
    n = 1200
    for seed in range(n):
        for name, options in settings.items():
            rows[name].append(engine.add(DIST_PROMPT, GenerationConfig(seed=seed, **options), draft=MODEL))
        other = others[seed % len(others)]
        engine.add([1, 2 + seed % 5, 4] * (1 + seed % 3), GenerationConfig(seed=seed, **other),
                   draft=MODEL if seed % 2 else None)
    engine.run()
    assert max(r for r, _ in engine.passes) == 12
    for name, options in settings.items():
        counts = torch.zeros(V * V)
        for row in rows[name]:
            x1, x2 = row.output.token_ids[:2]
            counts[x1 * V + x2] += 1
        sampling = SamplingParams(temperature=options["temperature"], top_k=options.get("top_k"),
                                  top_p=options.get("top_p", 1.0))
        assert chi_square_pvalue(counts.numpy(), exact_joint(target, sampling).numpy()) > 1e-3, name
    if speculation == "rows":
        assert all(r.output.stats.drafted_per_position[2] >= 1 for r in rows["t1"])  # rounds of 3 drafted tokens
    else:  # the batch's gamma drafted, less than the rows' own at times
        assert engine.gamma_policy.decided and sum(r.output.stats.drafted for r in rows["t1"]) > 0


def quantizations():
    """int8, and int4 where the CPU runs it (AVX-512 VNNI or AVX2): the kernels of the CPU's quantized targets."""
    from specdec.models.kernels import extension

    return ["int8", "int4"] if extension.cpu_supported() else ["int8"]


@pytest.mark.parametrize("method", quantizations())
def test_an_int8_target_row_is_bit_for_bit_whatever_shares_its_batch(method):
    """The block-invariant int8 (int4) target: a row's logits in a batch of four are the logits it gets alone."""
    target = quantized_copy(load_tiny(eos=None, hidden=128), method)
    assert target.block_invariant

    def logits_of(rows):
        session = BatchSession(target, len(rows), 64)
        for slot, prompt in enumerate(rows):
            session.prefill(slot, prompt[:-1])
        feeds = [torch.tensor(p[-1:] + [10, 11, 12][: 1 + len(p) % 3]) for p in rows]  # ragged: 2 to 4 tokens
        return session.extend(feeds, [len(f) for f in feeds])

    together = logits_of(PROMPTS[:4])
    for i in range(4):
        assert torch.equal(together[i], logits_of([PROMPTS[i]])[0]), i
    shuffled = logits_of([PROMPTS[2], PROMPTS[0], PROMPTS[3], PROMPTS[1]])
    assert all(torch.equal(shuffled[j], together[i]) for j, i in enumerate([2, 0, 3, 1]))


@pytest.mark.parametrize("method", quantizations())
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_batched_int8_row_equals_generate_alone_bit_for_bit(kind, method):
    """A block-invariant int8 target: every batched row (rows joining and leaving, ragged acceptance, plain
    and speculative rows) equals what specdec.generate gives its prompt alone, greedy and sampled (the same
    logits draw the same tokens from the same seed). Gemma 3's prompts and outputs outgrow its sliding window."""
    base = load_tiny(eos=None, hidden=128) if kind == "llama" else tiny_gemma3(sliding_window=6, eos=None)
    target = quantized_copy(base, method)
    draft = quantized_copy(perturbed(base, 0.05), method)
    configs = [GenerationConfig(max_new_tokens=12 + 3 * (i % 3), gamma=2 + i % 3, temperature=0.0 if i % 2 else 1.0,
                                seed=i) for i in range(len(PROMPTS))]
    for d in (draft, None):
        outs = specdec.generate_batch(target, PROMPTS, draft=d, configs=configs, max_batch=3, speculation="rows")
        alone = [specdec.generate(target, p, draft=d, config=c) for p, c in zip(PROMPTS, configs)]
        assert [o.token_ids for o in outs] == [a.token_ids for a in alone], d
        if d is not None:  # ragged acceptance: rows rejected drafts in different rounds
            assert any(o.stats.accepted < o.stats.drafted for o in outs) and any(o.stats.accepted for o in outs)


def test_the_batch_gamma_drafts_less_as_the_batch_grows():
    """Costs linear in the tokens a pass feeds (T(n) = 20 + n ms, a draft step 2 ms): one row of alpha 0.8
    drafts 5 tokens (Theorem 8's optimum for these costs), sixteen such rows 2; with dearer tokens
    (T(n) = 10 + 8 n ms) sixteen rows draft none while one row still drafts."""
    policy = BatchGamma(gamma=4, max_gamma=8)
    for rows, width in ((1, 1), (1, 5), (4, 3), (16, 1)):
        policy.observe(rows, width, (20 + rows * width) / 1000, 2, 0.004)
    assert (policy.choose([0.8]), policy.choose([0.8] * 16)) == (5, 2)
    dear = BatchGamma(gamma=4, max_gamma=8)
    for rows, width in ((1, 1), (16, 1), (16, 3)):
        dear.observe(rows, width, (10 + 8 * rows * width) / 1000, 2, 0.004)
    assert dear.choose([0.8] * 16) == 0 and dear.choose([0.8]) > 0
    fresh = BatchGamma(gamma=4, max_gamma=8)
    assert fresh.choose([0.8] * 3) == 0  # nothing timed yet: plain decoding's pass of 3 rows first,
    fresh.observe(3, 1, 0.030, 0, 0.0)
    assert fresh.choose([0.8] * 3) == 4  # then the configured gamma (a second pass size and a draft step timed)


def test_the_batch_gamma_does_not_count_a_catch_up_as_draft_steps():
    """A round after plain rounds first feeds the draft the tokens it missed: its time is not a draft step's (as in
    the one-sequence schedule). Counted, a probe after plain rounds made drafting look dear enough to stop it."""
    def policy_after(rounds):
        policy = BatchGamma(gamma=4, max_gamma=8)
        for rows, width, drafted, time_draft in rounds:
            policy.observe(rows, width, (20 + rows * width) / 1000, drafted, time_draft)
        return policy

    steady = [(2, 1, 2, 0.004), (2, 5, 4, 0.008), (2, 3, 2, 0.004)]  # 2 ms a step of 2 rows
    after_plain = steady + [(2, 1, 0, 0.0), (2, 2, 1, 0.040)]  # a plain round, then 1 token after a 40 ms catch-up
    assert policy_after(steady).draft_time == {2: pytest.approx(0.002)}
    assert policy_after(after_plain).draft_time == {2: pytest.approx(0.002)}
    assert policy_after(after_plain).choose([0.9] * 2) == policy_after(steady).choose([0.9] * 2) > 0
    resumed = after_plain + [(2, 4, 3, 0.009)]  # drafting again: its steps count (3 ms)
    assert policy_after(resumed).draft_time[2] == pytest.approx(0.9 * 0.002 + 0.1 * 0.003)


def test_bad_batch_requests_name_the_problem():
    target = load_tiny(eos=None)
    with pytest.raises(specdec.SpecDecError, match="one per prompt"):
        specdec.generate_batch(target, PROMPTS[:2], configs=[GenerationConfig()])
    engine = BatchEngine(target, None, max_batch=2, max_positions=40)
    with pytest.raises(specdec.SpecDecError, match="max_positions"):
        engine.add(PROMPTS[0], GenerationConfig(max_new_tokens=60))
    with pytest.raises(specdec.SpecDecError, match="max_batch"):
        BatchEngine(target, None, max_batch=0)


def test_a_cancelled_row_leaves_and_one_cancelled_while_waiting_never_runs():
    target = load_tiny(eos=None)
    engine = BatchEngine(target, perturbed(target, 0.05), max_batch=2)
    rows = [engine.add(p, GenerationConfig(max_new_tokens=30)) for p in PROMPTS[:3]]
    engine.step()
    engine.cancel(rows[0], "disconnected")  # running: it leaves before the next round
    engine.cancel(rows[2], "timeout")  # waiting for a row: it never joins
    finished = engine.step()
    assert rows[0] in finished and rows[2] in finished and str(rows[2].error) == "timeout"
    assert rows[0].output is None and rows[2].output is None and len(engine.rows) == 1
    engine.run()
    assert rows[1].output.token_ids == specdec.generate(target, PROMPTS[1], max_new_tokens=30).token_ids


def test_a_waiting_request_takes_a_cancelled_rows_slot_in_the_same_step():
    target = load_tiny(eos=None)
    engine = BatchEngine(target, perturbed(target, 0.05), max_batch=2)
    rows = [engine.add(p, GenerationConfig(max_new_tokens=30)) for p in PROMPTS[:3]]
    engine.step()
    assert engine.rows == rows[:2] and list(engine.waiting) == [rows[2]]
    engine.cancel(rows[0], "disconnected")
    assert engine.step() == [rows[0]]
    assert rows[2] in engine.rows and not engine.waiting  # it went in where the cancelled row left
    engine.run()
    for row, prompt in zip(rows[1:], PROMPTS[1:3]):
        assert row.output.token_ids == specdec.generate(target, prompt, max_new_tokens=30).token_ids

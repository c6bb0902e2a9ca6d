"""A speculative round (and plain decoding's step) captured whole (issue 40), checked on CPU with emulated graphs.

The emulated graph (``emulated_graphs`` in conftest) replays by running the captured function again into the
same output, so these tests hold the bookkeeping around a round graph to the eager tokens and to the target's
distribution; tests/test_cuda.py holds a real replay to the eager run on a GPU.
"""

import pytest
import torch

import specdec
from specdec import decoding, round_graph
from specdec.counter_random import PositionalRandom
from specdec.decoding import prepare_steps
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import PROMPT as DIST_PROMPT, V, exact_joint
from test_host_syncs import HostReads
from tiny import captured, load_tiny, perturbed, tiny_gemma3, tiny_model, tiny_tokenizer

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]
N_NEW = 24
GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=1.0)


def static(model):
    return specdec.load(model.hf_model, tokenizer=model.tokenizer, name=f"{model.name}-eager", engine="static")


def graphed_pair(base, scale=0.05, gammas=(4,), samplings=(GREEDY,), positions=64):
    target, draft = captured(base), captured(perturbed(base, scale))
    prepare_steps(target, [draft], list(gammas), positions, samplings)
    return target, draft


# -- the counter-based random source ----------------------------------------------------------------------------


def test_positional_random_is_a_function_of_seed_position_and_draw():
    def draws(seed, position, n=3):
        rng = PositionalRandom(torch.tensor([seed]), torch.tensor([position]))
        return [rng.uniform((1000,), torch.float64) for _ in range(n)]

    a, b = draws(7, 40), draws(7, 40)
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # replayable
    others = [draws(8, 40)[0], draws(7, 41)[0], a[1], a[2]]  # another seed, position, draw index
    assert all((x != a[0]).float().mean() > 0.99 for x in others)
    u32 = PositionalRandom(torch.tensor([3]), torch.tensor([9])).uniform((50_000,), torch.float32)
    assert u32.dtype == torch.float32 and 0.0 <= u32.min() and u32.max() < 1.0
    assert torch.equal(u32 * 2**24, torch.floor(u32 * 2**24))  # 24 bits: the cast never rounds up to 1.0


def test_positional_random_is_uniform_and_uncorrelated():
    u = torch.cat([PositionalRandom(torch.tensor([s]), torch.tensor([p])).uniform((200,), torch.float64)
                   for s in range(10) for p in range(50)])  # 100,000 numbers
    counts = torch.histc(u, bins=100, min=0.0, max=1.0)
    assert chi_square_pvalue(counts.numpy(), torch.full((100,), 0.01).numpy()) > 1e-3
    pairs = torch.histc(torch.floor(u[:-1] * 10) * 10 + torch.floor(u[1:] * 10), bins=100, min=0, max=100)
    assert chi_square_pvalue(pairs.numpy(), torch.full((100,), 0.01).numpy()) > 1e-3  # neighbours independent


# -- tokens ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3"])
def test_graphed_rounds_give_plain_decodings_tokens(kind, emulated_graphs):
    base = tiny_gemma3(sliding_window=4, eos=None) if kind == "gemma3" else load_tiny(kind, eos=None)
    reference = specdec.generate(static(base), PROMPT, max_new_tokens=N_NEW).token_ids
    target, draft = graphed_pair(base, gammas=(2, 4))
    for options in ({"gamma": 4}, {"gamma": 2}):
        out = specdec.generate(target, PROMPT, draft=draft, max_new_tokens=N_NEW, **options)
        assert out.token_ids == reference, options
        # every round was one graph: the first (the prefill leaves the prompt's last token to it) and the last ones
        # (a round of 4 or 2 drafts, cut to the budget)
        assert out.stats.rounds_per_step == 0 and out.stats.rounds_graphed == out.stats.target_calls >= 3, options
        # the rounds after the first were launched before the one before them was read, but the last ones
        # (that might not fit the budget)
        assert 1 <= out.stats.rounds_chained <= out.stats.target_calls - 1, options
    plain = specdec.generate(target, PROMPT, max_new_tokens=N_NEW)
    assert plain.token_ids == reference
    assert (plain.stats.rounds_graphed, plain.stats.rounds_per_step) == (N_NEW, 0)
    assert plain.stats.rounds_chained == N_NEW - 1  # every step but the first, launched before the last was read


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_chained_round_drafts_what_a_round_launched_from_the_host_drafts(sampling, emulated_graphs, monkeypatch):
    """The inputs a round leaves for the next (the last two tokens, the length) are those the host would set:
    the same proposals, acceptances and tokens as with every round launched from the host."""
    base = load_tiny("llama", eos=None)
    target, draft = graphed_pair(base, scale=0.5, samplings=(sampling,))

    def rounds(**options):
        events = []
        out = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=N_NEW, seed=3,
                               temperature=sampling.temperature, on_round=events.append, **options)
        return out, [(e.drafted, e.accepted) for e in events]

    chained, chained_rounds = rounds()
    monkeypatch.setattr(round_graph, "_chainable", lambda *args: False)
    from_host, host_rounds = rounds()
    assert chained.stats.rounds_chained >= 3 and from_host.stats.rounds_chained == 0
    assert chained.token_ids == from_host.token_ids and chained_rounds == host_rounds
    assert any(accepted < len(drafted) for drafted, accepted in host_rounds)  # rejections happened


def test_a_generation_that_ends_with_a_round_in_flight_leaves_nothing_behind(emulated_graphs):
    """A stop string ends the generation while the next round was already launched; that round's writes (cache
    positions past the sequence) are never read, and the next generation gives the reference tokens again."""
    base = load_tiny("qwen2", eos=None)
    reference = specdec.generate(static(base), PROMPT, max_new_tokens=N_NEW)
    stop = reference.text.split()[3]
    target, draft = graphed_pair(base, gammas=(2,))
    for d in (draft, None):
        stopped = specdec.generate(target, PROMPT, draft=d, gamma=2, max_new_tokens=N_NEW, stop=[stop])
        assert stopped.stats.stop_reason == "stop" and stopped.stats.rounds_chained >= 1
        assert reference.token_ids[: len(stopped.token_ids)] == stopped.token_ids
        again = specdec.generate(target, PROMPT, draft=d, gamma=2, max_new_tokens=N_NEW)
        assert again.token_ids == reference.token_ids


def test_any_drafters_greedy_proposal_is_verified_in_a_graph(emulated_graphs):
    """Prompt lookup, a hierarchy and random drafts propose on their own; at temperature 0 the graph takes their ids."""
    base = load_tiny("llama", eos=None)
    reference = specdec.generate(static(base), PROMPT, max_new_tokens=N_NEW).token_ids
    target, draft = captured(base), captured(perturbed(base, 0.05))
    drafts = ["prompt-lookup", [draft, "prompt-lookup"], "random"]
    prepare_steps(target, drafts, [4], 64)  # the last rounds, cut short by the budget, replay the gamma-4 graph
    for d in drafts:
        out = specdec.generate(target, PROMPT, draft=d, gamma=4, max_new_tokens=N_NEW)
        assert out.token_ids == reference, d
        assert out.stats.rounds_per_step == 0 and out.stats.rounds_graphed == out.stats.target_calls, d
    lookup = specdec.generate(target, PROMPT * 3, draft="prompt-lookup", gamma=4, max_new_tokens=N_NEW)
    assert lookup.stats.accepted > 0 and lookup.stats.rounds_per_step == 0  # proposals accepted inside the graph


def test_prompt_lookup_on_the_device_proposes_what_the_host_search_proposes():
    """round_graph.device_lookup (inside a captured round) against drafters.find_continuation: random sequences
    over small vocabularies (many repeats), every length from 1, k from 1 to 7, junk past the length."""
    from specdec.drafters import find_continuation
    from specdec.round_graph import device_lookup

    gen = torch.Generator().manual_seed(0)
    checked = found = 0
    for trial in range(400):
        vocab = 2 + trial % 7
        length = 1 + trial % 40
        buffer = torch.randint(0, vocab, (48,), generator=gen)  # [C]: entries past the length are junk
        k = 1 + trial % 7
        for ngrams in ((3, 1), (2, 2)):
            expected = find_continuation(buffer[:length].tolist(), k, *ngrams)
            got = device_lookup(buffer, torch.tensor([length]), k, *ngrams)
            assert got.tolist() == expected + [-1] * (k - len(expected)), (buffer[:length].tolist(), k, ngrams)
            checked, found = checked + 1, found + bool(expected)
    assert checked == 800 and 200 < found < 800  # both outcomes, many times


def test_prompt_lookup_rounds_are_searched_on_the_device_and_chained(emulated_graphs):
    """Planned prompt lookup runs as one graph a round (its search inside it) and chains like a model draft's
    rounds; it proposes and accepts what the host's search does, round by round, and gives plain tokens."""
    base = load_tiny("llama", eos=None)
    prompt = PROMPT * 3
    reference = specdec.generate(static(base), prompt, max_new_tokens=N_NEW).token_ids
    host_events = []
    specdec.generate(static(base), prompt, draft="prompt-lookup", gamma=4, max_new_tokens=N_NEW,
                     on_round=host_events.append)
    target = captured(base)
    prepare_steps(target, ["prompt-lookup"], [4], 64)
    assert (round_graph.LOOKUP, 4, GREEDY) in target._caches[0][0].rounds
    events = []
    out = specdec.generate(target, prompt, draft="prompt-lookup", gamma=4, max_new_tokens=N_NEW, on_round=events.append)
    assert out.token_ids == reference
    assert out.stats.rounds_per_step == 0 and out.stats.rounds_graphed == out.stats.target_calls
    assert out.stats.rounds_chained >= 2 and out.stats.accepted > 0
    # round by round the same proposals and acceptances (the last rounds aside: the host proposes within the
    # budget, the graph its whole gamma, cut afterwards)
    pairs = [(e.drafted, e.accepted) for e in events]
    assert len(pairs) >= 5 and pairs[:-2] == [(e.drafted, e.accepted) for e in host_events][: len(pairs) - 2]


def test_rounds_outside_the_plan_run_step_by_step(emulated_graphs):
    base = load_tiny("qwen2", eos=None)
    reference = specdec.generate(static(base), PROMPT, max_new_tokens=N_NEW).token_ids
    target, draft = graphed_pair(base, gammas=(4,))
    for options in ({"gamma": 3}, {"gamma": 4, "gamma_schedule": "adaptive"}, {"gamma": 4, "draft": "prompt-lookup"}):
        options = {"draft": draft, **options}
        out = specdec.generate(target, PROMPT, max_new_tokens=N_NEW, **options)
        assert out.token_ids == reference, options
        # a gamma, a schedule or a draft (prompt lookup was not planned) the plan does not cover runs step by step; at most the last token,
        # a plain step (k = 0: the budget leaves no room for a draft), can replay plain decoding's graph
        assert out.stats.rounds_graphed <= 1 and out.stats.rounds_per_step >= out.stats.target_calls - 1, options
    sampled = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=N_NEW, temperature=1.0, seed=2)
    assert sampled.stats.rounds_graphed == 0  # the plan captured greedy rounds only


@pytest.mark.parametrize(("positions", "chunks"), [
    (300, [(256, 256), (35, 64)]),  # capacity 332: 291 tokens, 512 does not fit
    (520, [(511, 512)]),
    (700, [(512, 512), (128, 128), (51, 64)]),  # capacity 732: after 512, a 256-wide chunk would run past it
    (16, []),  # capacity 48: no prefill width fits, the prefill runs eagerly
])
def test_a_prepared_model_prefills_through_captured_chunks(positions, chunks, emulated_graphs, monkeypatch):
    """The prompt (less its last token, which the first round feeds) runs through the captured prefill widths
    that fit the capacity (positions + the widest step): the narrowest that holds it, else chunks of the
    widest; none fits a small capacity, and the prefill runs eagerly. The tokens are plain decoding's."""
    from specdec.models.sessions import graphs

    model = tiny_model("qwen2", eos=None)
    model.config.max_position_embeddings = 1024  # room for prompts past the widest step
    base = specdec.load(model, tokenizer=tiny_tokenizer(), name="tiny-qwen2-1k")
    prompt = [(7 * i) % 90 + 5 for i in range(700)]
    reference = specdec.generate(static(base), prompt[:positions - 8], max_new_tokens=6).token_ids
    target = captured(base)
    prepare_steps(target, [], [], positions)  # plain decoding's plan: its step, its round, the prefills
    calls = []
    real = graphs.CapturedPrefill.__call__
    monkeypatch.setattr(graphs.CapturedPrefill, "__call__",
                        lambda self, tokens, start: (calls.append((tokens.shape[0], self.width)), real(self, tokens, start))[1])
    out = specdec.generate(target, prompt[:positions - 8], max_new_tokens=6)
    assert out.token_ids == reference
    assert calls == chunks
    assert out.stats.rounds_graphed == 6 and out.stats.rounds_per_step == 0


# -- the same draws, eager and replayed ---------------------------------------------------------------------------


def test_a_replayed_round_draws_what_the_eager_round_draws(emulated_graphs, monkeypatch):
    base = load_tiny("llama", eos=None)
    target, draft = graphed_pair(base, scale=0.5, samplings=(SAMPLED,))
    options = dict(draft=draft, gamma=4, max_new_tokens=N_NEW, temperature=1.0)
    replayed = [specdec.generate(target, PROMPT, seed=s, **options) for s in range(4)]
    assert all(out.stats.rounds_graphed >= 2 for out in replayed)
    # the same generations with each captured round computed eagerly from its inputs instead of replayed
    monkeypatch.setattr(round_graph.RoundGraph, "replay", lambda self, *inputs: (self.set_inputs(*inputs), self.run())[1])
    monkeypatch.setattr(round_graph.RoundGraph, "replay_chained", lambda self: self.run())
    eager = [specdec.generate(target, PROMPT, seed=s, **options) for s in range(4)]
    assert [o.token_ids for o in replayed] == [o.token_ids for o in eager]
    assert len({tuple(o.token_ids) for o in replayed}) == 4  # the seed matters
    assert any(o.stats.acceptance_rate < 1 for o in replayed)  # rejections and residual draws happened


# -- the distribution -----------------------------------------------------------------------------------------


def graphed_joint(target, draft, n_runs):
    counts = torch.zeros(V * V)
    graphed = 0
    for seed in range(n_runs):
        out = specdec.generate(target, DIST_PROMPT, draft=draft, gamma=3, max_new_tokens=5, temperature=1.0, seed=seed)
        x1, x2 = out.token_ids[:2]
        counts[x1 * V + x2] += 1
        graphed += out.stats.rounds_per_step == 0
    return counts, graphed


@pytest.fixture(scope="module")
def dist_target():
    return load_tiny(vocab=V, eos=None, sharp=2.0)


def test_graphed_rounds_follow_the_target_distribution(dist_target, emulated_graphs):
    target, draft = captured(dist_target), captured(perturbed(dist_target, 1.0, seed=3))
    prepare_steps(target, [draft], [3], 32, [SAMPLED])  # the last rounds replay it too, cut to the budget
    counts, graphed = graphed_joint(target, draft, 1500)
    assert graphed == 1500  # every round of every run was one replayed graph, the first one too
    assert chi_square_pvalue(counts.numpy(), exact_joint(dist_target, SAMPLED).numpy()) > 1e-3


def test_a_planted_bug_in_the_captured_acceptance_fails_the_distribution_test(dist_target, emulated_graphs,
                                                                             monkeypatch):
    real_verify = round_graph.verify

    def no_residual(logits, drafted, q, sampling, rng, *args):
        # the bug: a rejected position resamples from p itself instead of norm(max(0, p - q))
        return real_verify(logits, drafted, q * 0 if q is not None else None, sampling, rng, *args)

    monkeypatch.setattr(round_graph, "verify", no_residual)
    target, draft = captured(dist_target), captured(perturbed(dist_target, 1.0, seed=3))
    prepare_steps(target, [draft], [3], 32, [SAMPLED])
    counts, graphed = graphed_joint(target, draft, 1500)
    assert graphed == 1500
    assert chi_square_pvalue(counts.numpy(), exact_joint(dist_target, SAMPLED).numpy()) < 1e-3


# -- one read-back per round ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_graphed_round_reads_the_device_once(sampling, emulated_graphs, monkeypatch):
    base = load_tiny("qwen2", eos=None)
    target, draft = graphed_pair(base, samplings=(sampling,))
    copies = []
    for method in ("tolist", "cpu", "numpy", "item"):
        real = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method, lambda self, *a, _m=method, _real=real, **k:
                            (copies.append(_m), _real(self, *a, **k))[1])
    for d in (draft, None):
        copies.clear()
        with HostReads() as reads:
            out = specdec.generate(target, PROMPT, draft=d, gamma=4, max_new_tokens=N_NEW, seed=1,
                                   temperature=sampling.temperature)
        assert out.stats.rounds_graphed >= 3
        assert reads.counts == {}  # no scalar read or value-shaped op
        assert copies == ["tolist"] * out.stats.target_calls  # one read-back per round, graphed or not

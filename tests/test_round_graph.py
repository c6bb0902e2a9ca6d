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
from tiny import captured, load_tiny, perturbed, tiny_gemma3

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
        # every round but the first (its token comes with the prefill) and the short last ones was one graph
        assert out.stats.rounds_graphed >= 3 and out.stats.rounds_per_step <= 3, out.stats.to_dict()
        assert out.stats.rounds_graphed + out.stats.rounds_per_step == out.stats.target_calls
    plain = specdec.generate(target, PROMPT, max_new_tokens=N_NEW)
    assert plain.token_ids == reference
    assert (plain.stats.rounds_graphed, plain.stats.rounds_per_step) == (N_NEW - 1, 1)


def test_any_drafters_greedy_proposal_is_verified_in_a_graph(emulated_graphs):
    """Prompt lookup, a hierarchy and random drafts propose on their own; at temperature 0 the graph takes their ids."""
    base = load_tiny("llama", eos=None)
    reference = specdec.generate(static(base), PROMPT, max_new_tokens=N_NEW).token_ids
    target, draft = captured(base), captured(perturbed(base, 0.05))
    drafts = ["prompt-lookup", [draft, "prompt-lookup"], "random"]
    prepare_steps(target, drafts, [1, 2, 3, 4], 64)  # the budget cuts the last rounds short
    for d in drafts:
        out = specdec.generate(target, PROMPT, draft=d, gamma=4, max_new_tokens=N_NEW)
        assert out.token_ids == reference, d
        assert out.stats.rounds_per_step == 1 and out.stats.rounds_graphed == out.stats.target_calls - 1, d
    lookup = specdec.generate(target, PROMPT * 3, draft="prompt-lookup", gamma=4, max_new_tokens=N_NEW)
    assert lookup.stats.accepted > 0 and lookup.stats.rounds_per_step == 1  # proposals accepted inside the graph


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


# -- the same draws, eager and replayed ---------------------------------------------------------------------------


def test_a_replayed_round_draws_what_the_eager_round_draws(emulated_graphs, monkeypatch):
    base = load_tiny("llama", eos=None)
    target, draft = graphed_pair(base, scale=0.5, samplings=(SAMPLED,))
    options = dict(draft=draft, gamma=4, max_new_tokens=N_NEW, temperature=1.0)
    replayed = [specdec.generate(target, PROMPT, seed=s, **options) for s in range(4)]
    assert all(out.stats.rounds_graphed >= 2 for out in replayed)
    # the same generations with each captured round computed eagerly from its inputs instead of replayed
    monkeypatch.setattr(round_graph.RoundGraph, "replay", lambda self, *inputs: (self.set_inputs(*inputs), self.run())[1])
    eager = [specdec.generate(target, PROMPT, seed=s, **options) for s in range(4)]
    assert [o.token_ids for o in replayed] == [o.token_ids for o in eager]
    assert len({tuple(o.token_ids) for o in replayed}) == 4  # the seed matters
    assert any(o.stats.acceptance_rate < 1 for o in replayed)  # rejections and residual draws happened


# -- the distribution -----------------------------------------------------------------------------------------


def from_the_first_round(monkeypatch):
    """Generations whose first round is graphed too: the target's cache given back the prompt's last token, as
    between any two rounds (normally the first token comes with the prefill, step by step)."""
    real = decoding._prepare

    def prepare(*args, **kwargs):
        run = real(*args, **kwargs)
        run.session.rollback(len(run.sequence) - 1)
        run.carried = None
        return run

    monkeypatch.setattr(decoding, "_prepare", prepare)


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


def test_graphed_rounds_follow_the_target_distribution(dist_target, emulated_graphs, monkeypatch):
    from_the_first_round(monkeypatch)
    target, draft = captured(dist_target), captured(perturbed(dist_target, 1.0, seed=3))
    prepare_steps(target, [draft], [1, 2, 3], 32, [SAMPLED])  # the budget cuts the last rounds to 2 and 1
    counts, graphed = graphed_joint(target, draft, 1500)
    assert graphed == 1500  # every round of every run was one replayed graph (3 drafts decide the first tokens)
    assert chi_square_pvalue(counts.numpy(), exact_joint(dist_target, SAMPLED).numpy()) > 1e-3


def test_a_planted_bug_in_the_captured_acceptance_fails_the_distribution_test(dist_target, emulated_graphs,
                                                                             monkeypatch):
    from_the_first_round(monkeypatch)
    real_verify = round_graph.verify

    def no_residual(logits, drafted, q, sampling, rng, *args):
        # the bug: a rejected position resamples from p itself instead of norm(max(0, p - q))
        return real_verify(logits, drafted, q * 0 if q is not None else None, sampling, rng, *args)

    monkeypatch.setattr(round_graph, "verify", no_residual)
    target, draft = captured(dist_target), captured(perturbed(dist_target, 1.0, seed=3))
    prepare_steps(target, [draft], [1, 2, 3], 32, [SAMPLED])  # the budget cuts the last rounds to 2 and 1
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

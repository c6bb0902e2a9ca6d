"""The engine: sessions (prefill / extend / rollback), the static position-indexed cache, verify on the
device, and devices. CPU tests here; tests marked ``cuda`` run where a GPU is (tests/test_cuda.py)."""

import pytest
import torch

import specdec
from specdec.acceptance import greedy_verification, speculative_sampling, verify
from specdec.devices import resolve_device
from specdec.models.sessions.graphs import MAX_GRAPH_WIDTH, WIDTH_BUCKETS, compiled_step, static_step
from specdec.models.cache.kv_cache import cache_argument
from specdec.models.sessions.session import DynamicSession, StaticSession
from specdec.sampling import SamplingParams, standardize
from tiny import captured, load_tiny, perturbed, tiny_gemma3, tiny_model, tiny_tokenizer

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]
N_NEW = 40


def static(model):
    """The same weights behind the static engine (a second wrapper: the caches are per wrapper)."""
    return specdec.load(model.hf_model, tokenizer=model.tokenizer, name=f"{model.name}-static", engine="static")


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def target(request):
    if request.param == "gemma3":
        return tiny_gemma3(sliding_window=4, eos=None)
    return load_tiny(request.param, eos=None)


def fresh_logits(model, ids, n):
    with torch.inference_mode():
        return model.hf_model(input_ids=torch.tensor([ids])).logits[0, -n:]


def test_static_session_rollbacks_give_the_logits_of_a_fresh_forward(target):
    model = static(target)
    session, seq = model.start(PROMPT, 64)
    assert isinstance(session, StaticSession)
    session.prefill(seq)
    base = PROMPT
    session.extend([20, 21, 22, 23, 24], 5)  # five drafted tokens, all rejected below
    session.rollback(len(base))
    session.extend([30], 1)
    session.extend([31, 32, 33], 3)
    session.rollback(len(base) + 2)  # keep 30, 31: rolls back across the sliding window (4) for Gemma 3
    logits = session.extend([40, 41], 2)
    torch.testing.assert_close(logits, fresh_logits(target, base + [30, 31, 40, 41], 2), rtol=1e-4, atol=1e-4)
    assert session.length == len(base) + 4
    session.close()


def test_a_static_cache_is_reused_and_never_shared(target):
    model = static(target)
    a, _ = model.start(PROMPT, 64)
    b, _ = model.start(PROMPT, 64)
    assert a.cache is not b.cache  # two live sessions (target as its own draft) need two caches
    cache = a.cache
    a.close()
    c, _ = model.start(PROMPT, 64)
    assert c.cache is cache  # given back, taken again: its captured graphs stay valid
    b.close()
    c.close()


def test_captured_steps_pad_narrow_requests_and_replay_the_eager_logits(target, emulated_graphs):
    model, eager = captured(target), static(target)
    sessions = [m.start(PROMPT, 64)[0] for m in (model, eager)]
    for session in sessions:
        session.prefill(PROMPT[:-1])
    steps = [([11, 20, 21, 22, 23], 5, None), ([24], 1, len(PROMPT) + 1), ([30, 31], 2, None),
             ([40, 41, 42], 3, len(PROMPT)), ([50, 51, 52, 53], 2, len(PROMPT) + 2), ([60], 1, None)]
    outs = []
    for tokens, n, rollback_to in steps:
        outs.append([s.extend(tokens, n) for s in sessions])
        if rollback_to is not None:
            for s in sessions:
                s.rollback(rollback_to)
    for graph_out, eager_out in outs:  # compared at the end: a returned output must not be the graph's buffer
        torch.testing.assert_close(graph_out, eager_out, rtol=1e-5, atol=1e-5)
    # each width runs in its bucket (1, 2, 4, 8, ...), padded; an unprepared cache captures a bucket on first use
    assert emulated_graphs == [(5, 8), (1, 1), (2, 2), (3, 4), (4, 4), (1, 1)]
    assert sorted(sessions[0].cache.graphs) == [1, 2, 4, 8]
    for s in sessions:
        s.close()


def test_generations_through_captured_steps_give_the_eager_tokens(target, emulated_graphs):
    draft = perturbed(target, 0.05)
    model, draft_model = captured(target), captured(draft)
    reference = specdec.generate(static(target), PROMPT, max_new_tokens=N_NEW)
    for _ in range(2):  # the second generation replays the graphs the first one captured
        assert specdec.generate(model, PROMPT, max_new_tokens=N_NEW).token_ids == reference.token_ids
        for options in ({"gamma": 4}, {"gamma": 6, "gamma_schedule": "adaptive"}):
            out = specdec.generate(model, PROMPT, draft=draft_model, max_new_tokens=N_NEW, **options)
            assert out.token_ids == reference.token_ids, options
    sampled = [specdec.generate(m, PROMPT, draft=d, gamma=3, max_new_tokens=N_NEW, temperature=1.0, seed=11).token_ids
               for m, d in ((model, draft_model), (static(target), static(draft)))]
    assert sampled[0] == sampled[1]  # the same random draws on the same logits
    widths = {width for _, width in emulated_graphs}
    assert {1, 8}.issubset(widths) and any(k < width for k, width in emulated_graphs)
    caches = [cache for m in (model, draft_model) for cache, _ in m._caches]
    assert len(caches) == 2  # one cache per model, taken again by every generation with its graphs


def test_prepared_steps_are_the_ones_later_generations_replay(target, emulated_graphs):
    model, draft = captured(target), captured(perturbed(target, 0.05))
    assert static(target).prepare_steps() == []  # without CUDA graphs: nothing to prepare
    positions = len(PROMPT) + N_NEW + 1
    assert model.prepare_steps(positions) == list(WIDTH_BUCKETS)
    assert emulated_graphs[::-1] == [(w, w) for w in WIDTH_BUCKETS]  # captured largest first...
    assert draft.prepare_steps(positions) == list(WIDTH_BUCKETS)
    (target_cache, _), = model._caches
    (draft_cache, _), = draft._caches
    pools = {step.graph.pool for cache in (target_cache, draft_cache) for step in cache.graphs.values()}
    assert len(pools) == 2 and None not in pools  # ...into one memory pool per model
    assert target_cache.capacity == draft_cache.capacity == positions + MAX_GRAPH_WIDTH  # one fixed capacity
    prepared = dict(target_cache.graphs), dict(draft_cache.graphs)
    reference = specdec.generate(static(target), PROMPT, max_new_tokens=N_NEW)
    out = specdec.generate(model, PROMPT, draft=draft, gamma=4, max_new_tokens=N_NEW)
    assert out.token_ids == reference.token_ids  # the preparation's dummy tokens left nothing behind
    assert [c for c, _ in model._caches] == [target_cache] and [c for c, _ in draft._caches] == [draft_cache]
    assert (target_cache.graphs, draft_cache.graphs) == prepared  # nothing captured during the generation
    assert model.prepare_steps(positions) == list(WIDTH_BUCKETS) and target_cache.graphs == prepared[0]  # kept


def test_prepare_steps_prepares_every_model_a_draft_runs(target, emulated_graphs):
    from specdec.decoding import prepare_steps

    def buckets(model):
        return [sorted(cache.graphs) for cache, _ in model._caches]

    model, m1, m2 = captured(target), captured(perturbed(target, 0.05)), captured(perturbed(target, 0.3, seed=4))
    other = captured(perturbed(target, 0.1, seed=6))
    positions = len(PROMPT) + N_NEW + 1
    prepared = prepare_steps(model, [[m1, m2, "prompt-lookup"], "bigram", model], [3], positions)
    assert prepared == [model, m1, m2]  # the target as its own draft is prepared once; a model no draft runs is not
    # the buckets up to each model's widest step: the target verifies 3 drafts after a token (4); each level of
    # the hierarchy verifies the level below it (4); nothing wider is captured (with compile: compiled)
    # (the target drafting for itself holds a second cache, taken when its round is captured whole: no step graphs)
    assert (buckets(model), buckets(m1), buckets(m2), buckets(other)) == ([[1, 2, 4], []], [[1, 2, 4]], [[1, 2, 4]], [])
    before = [buckets(m) for m in (model, m1, m2)]
    out = specdec.generate(model, PROMPT, draft=[m1, m2, "prompt-lookup"], gamma=3, max_new_tokens=N_NEW)
    assert [buckets(m) for m in (model, m1, m2)] == before  # the hierarchy's generation captured nothing more
    assert out.token_ids == specdec.generate(static(target), PROMPT, max_new_tokens=N_NEW).token_ids
    plain = captured(target)
    assert prepare_steps(plain, [], [3]) == [plain] and buckets(plain) == [[1]]  # plain decoding: one token a step
    # a wider plan later prepares the model again, with every bucket up to its widest step (gamma 8: 9 -> 16)
    assert prepare_steps(plain, ["prompt-lookup"], [8], positions) == [plain] and buckets(plain) == [[1, 2, 4, 8, 16]]
    assert plain.prepare_steps(positions, 2) == [1, 2, 4, 8, 16]  # a narrower plan keeps what is captured
    assert plain.prepare_steps(positions) == list(WIDTH_BUCKETS)  # no widest step named: every bucket


def test_after_prepare_no_generation_captures_anything(emulated_graphs, monkeypatch):
    """The capture plan (issue 29, point 3): after prepare_steps, a grid of generations (every schedule, catch-ups
    after plain rounds, a draft with another tokenizer, hierarchies, sampling, a prompt longer than any before,
    a generation longer than the prepared capacity) captures nothing, gives the eager tokens, and every model
    keeps one graph per bucket."""
    from specdec.decoding import prepare_steps
    from specdec.models.sessions import graphs
    from test_retokenized import byte_bpe, tiny_draft

    captures = []  # (kind, width) of every capture, steps and prefill chunks alike
    real_capture = graphs.CapturedStep._capture
    monkeypatch.setattr(graphs.CapturedStep, "_capture", lambda self: captures.append(
        (type(self).__name__, self.width)) or real_capture(self))
    base = load_tiny(eos=None)
    target = captured(base)
    close, far = captured(perturbed(base, 0.05)), captured(perturbed(base, 0.3, seed=4))
    bad = captured(perturbed(base, 3.0, seed=7))  # the adaptive schedule stops drafting, then probes: catch-ups
    other = tiny_draft(byte_bpe(merges=40))
    retokenized = specdec.load(other.hf_model, tokenizer=other.tokenizer, name="retokenized-captured", engine="static")
    retokenized.cuda_graphs = True
    drafts = [close, [close, far, "prompt-lookup"], [close, "bigram"], bad, retokenized, "prompt-lookup"]
    positions = 200
    assert prepare_steps(target, drafts, [4], positions) == [target, close, far, bad, retokenized]
    # the buckets up to each model's widest step at gamma 4: verifying 5 tokens (the target; close and far as
    # levels that verify the level below), a model draft's 2, a retokenized draft's catch-up of 4
    plan = {target: [1, 2, 4, 8], close: [1, 2, 4, 8], far: [1, 2, 4, 8], bad: [1, 2], retokenized: [1, 2, 4]}
    # and each model's prefill chunks within its capacity (200 positions + the widest step: 64 and 128 wide)
    expected = [("CapturedStep", b) for buckets in plan.values() for b in buckets]
    expected += [("CapturedPrefill", w) for _ in plan for w in (64, 128)]
    assert sorted(captures) == sorted(expected)
    captures.clear()

    long_prompt = (PROMPT * 12)[:90]  # longer than any prompt before
    eager = static(base)
    grid = [(prompt, draft, options) for prompt in (PROMPT, long_prompt) for draft in [None, *drafts]
            for options in ({"gamma": 4}, {"gamma": 6, "gamma_schedule": "adaptive"},
                            {"gamma_schedule": "heuristic"}, {"gamma_schedule": "confidence", "confidence": 0.3})]
    grid += [(PROMPT, [close, far, "prompt-lookup"], {"gamma": 5, "temperature": 1.0, "seed": 3}),
             (PROMPT, close, {"gamma": 3, "temperature": 0.8, "top_k": 5, "seed": 4})]
    for prompt, draft, options in grid:
        out = specdec.generate(target, prompt, draft=draft, max_new_tokens=N_NEW, **options)
        if options.get("temperature", 0.0) == 0.0:
            assert out.token_ids == specdec.generate(eager, prompt, max_new_tokens=N_NEW).token_ids, (draft, options)
    assert any(k not in WIDTH_BUCKETS for k, _ in emulated_graphs)  # varying widths ran, padded into buckets
    out = specdec.generate(target, PROMPT, draft=close, gamma=4, max_new_tokens=positions)  # past the capacity
    assert out.token_ids == specdec.generate(eager, PROMPT, max_new_tokens=positions).token_ids
    assert captures == []  # nothing was captured after prepare_steps (steps wider than the plan ran eagerly)
    for model, buckets in plan.items():
        graphed = [sorted(cache.graphs) for cache, _ in model._caches if cache.graphs]
        assert graphed == [buckets], model.name  # one graph per planned bucket, on the one prepared cache
        assert all(cache.capacity == positions + MAX_GRAPH_WIDTH for cache, _ in model._caches if cache.graphs)


def test_static_engine_greedy_equals_dynamic_engine_and_transformers(target):
    model = static(target)
    dynamic = specdec.generate(target, PROMPT, max_new_tokens=N_NEW)
    plain = specdec.generate(model, PROMPT, max_new_tokens=N_NEW)
    hf = target.hf_model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=N_NEW,
                                  min_new_tokens=N_NEW, pad_token_id=3)
    assert len(plain.token_ids) == N_NEW
    assert plain.token_ids == dynamic.token_ids == hf[0, len(PROMPT):].tolist()
    for name, draft in {"close": perturbed(target, 0.05), "poor": perturbed(target, 1.0, seed=7),
                        "prompt-lookup": "prompt-lookup", "itself": model}.items():
        draft_model = static(draft) if isinstance(draft, specdec.LanguageModel) and draft is not model else draft
        for gamma in (1, 3, 6):
            out = specdec.generate(model, PROMPT, draft=draft_model, gamma=gamma, max_new_tokens=N_NEW)
            assert out.token_ids == plain.token_ids, f"{name}, gamma={gamma}"


def test_several_rejections_in_a_row_roll_back_correctly(target):
    model = static(target)
    poor = static(perturbed(target, 1.0, seed=7))
    plain = specdec.generate(model, PROMPT, max_new_tokens=N_NEW)
    out = specdec.generate(model, PROMPT, draft=poor, gamma=4, max_new_tokens=N_NEW)
    assert out.token_ids == plain.token_ids
    # rounds that accepted nothing, back to back: the caches rolled back by 4 positions each time
    origins = out.from_draft
    runs_of_target_tokens = sum(1 for i in range(1, len(origins)) if not origins[i] and not origins[i - 1])
    assert out.stats.accepted < out.stats.drafted / 2 and runs_of_target_tokens >= 5


def test_adaptive_and_heuristic_schedules_on_the_static_engine(target):
    model = static(target)
    draft = static(perturbed(target, 0.05))
    plain = specdec.generate(model, PROMPT, max_new_tokens=N_NEW)
    for schedule in ("heuristic", "adaptive"):
        out = specdec.generate(model, PROMPT, draft=draft, gamma=3, gamma_schedule=schedule, max_new_tokens=N_NEW)
        assert out.token_ids == plain.token_ids, schedule


@pytest.mark.parametrize("fused", [False, True], ids=["", "fused"])  # fused: as the GPU path runs them
@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])  # Llama is Qwen2 without attention biases
def test_the_fixed_width_step_compiles_as_one_graph_for_every_position(kind, fused):
    """What ``compile=True`` on a GPU needs, checked where CI runs (inductor's CPU backend): the step
    traces as one graph (fullgraph: no graph break, no Python branch on a tensor's value), computes the
    eager step's logits, and serves every position without recompiling (the position is an input); with
    the sibling projections fused too (specdec.models.fused_linear)."""
    from specdec.models.fused_linear import fuse_siblings

    target = tiny_gemma3(sliding_window=4, eos=None) if kind == "gemma3" else load_tiny(kind, eos=None)
    model = static(target)
    if fused:
        fuse_siblings(model.hf_model)
    other_class = tiny_model("llama")  # built before compiling: a new model class changes transformers' globals
    torch._dynamo.reset()  # the other architecture's entry would count as a recompilation here
    step = torch.compile(static_step, dynamic=False, fullgraph=True)
    sessions = [model.start(PROMPT, 64)[0] for _ in range(2)]  # one compiled, one eager: the same writes
    for session in sessions:
        session.prefill(PROMPT)
    ids = torch.tensor([[20, 21, 22, 23]])  # [1, 4]
    with torch.inference_mode(), torch._dynamo.config.patch(error_on_recompile=True):
        for start in (len(PROMPT), len(PROMPT) + 2, len(PROMPT) + 9):  # overlapping: a rollback, then past it
            position = torch.tensor([start])
            compiled = step(model.hf_model, sessions[0].cache, ids, position)
            eager = static_step(model.hf_model, sessions[1].cache, ids, position)
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
        cache_argument(other_class, None)  # a keyword looked up for another class between steps: no guard fails
        step(model.hf_model, sessions[0].cache, ids, position)
    for session in sessions:
        session.close()


def test_compiled_steps_of_many_widths_and_two_architectures_all_stay_compiled():
    """Every width of every model is its own entry in one dynamo cache; past torch's default limit (8)
    dynamo would quietly run the step eagerly. Traced with the eager backend: the same entries, fast."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    step = compiled_step(backend="eager")
    models = [static(load_tiny("qwen2", eos=None)), static(tiny_gemma3(sliding_window=4, eos=None))]
    widths = range(1, 7)
    with torch.inference_mode():
        for model in models:
            session = model.start(PROMPT, 64)[0]
            session.prefill(PROMPT)
            for width in widths:
                ids = torch.arange(20, 20 + width)[None]  # [1, w]
                start = torch.tensor([len(PROMPT)])
                torch.testing.assert_close(step(model.hf_model, session.cache, ids, start),
                                           static_step(model.hf_model, session.cache, ids, start))
            session.close()
    assert counters["stats"]["unique_graphs"] == len(models) * len(widths)  # 12 entries, none fell back


def test_hierarchy_on_the_static_engine(target):
    model = static(target)
    middle = static(perturbed(target, 0.05))
    plain = specdec.generate(model, PROMPT, max_new_tokens=N_NEW)
    out = specdec.generate(model, PROMPT, draft=[middle, "prompt-lookup"], gamma=4, max_new_tokens=N_NEW)
    assert out.token_ids == plain.token_ids
    assert out.stats.levels and out.stats.levels[0]["calls"] > 0


# -- verify: the device-side acceptance step equals the reference functions ------------------------------


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("one_hot", [False, True])
def test_verify_returns_what_the_reference_functions_return(sampled, one_hot):
    V, gamma = 11, 4
    sampling = SamplingParams(temperature=1.0 if sampled else 0.0)
    agreed = 0
    for seed in range(300):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(gamma + 1, V, generator=g) * 2
        q = None if one_hot else standardize(torch.randn(gamma, V, generator=g) * 2, SamplingParams(1.0))
        draft = torch.randint(0, V, (gamma,), generator=g)
        if not sampled:  # make the draft right for a random prefix so every n occurs
            draft[: seed % (gamma + 1)] = logits.argmax(-1)[: seed % (gamma + 1)]
        result = verify(logits, draft, q, sampling, torch.Generator().manual_seed(seed))
        tokens, n, betas = result.read()
        if sampled:
            ref_tokens, ref_n = speculative_sampling(standardize(logits, sampling), q, draft,
                                                     torch.Generator().manual_seed(seed))
        else:
            ref_tokens, ref_n = greedy_verification(logits.argmax(-1), draft)
        assert (tokens, n) == (ref_tokens.tolist(), ref_n), seed
        assert len(betas) == min(n + 1, gamma)
        agreed += n
    assert 0 < agreed < 300 * gamma  # both acceptances and rejections were exercised


def test_verify_with_lenience_accepts_more_and_says_so():
    gamma = 3
    logits = torch.tensor([[2.0, 1.9, 0, 0, 0, 0, 0]] * (gamma + 1))
    draft = torch.tensor([1, 1, 1])  # never the argmax, but within l = 0.5 of it
    exact = verify(logits, draft, None, SamplingParams(0.0)).read()
    lenient = verify(logits, draft, None, SamplingParams(0.0), lenience=0.5).read()
    assert exact[1] == 0 and exact[0] == [0]
    assert lenient[1] == 3 and lenient[0] == [1, 1, 1, 0]


# -- devices ------------------------------------------------------------------------------------------------


def test_device_names_resolve_or_fail_clearly():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(specdec.SpecDecError, match="unknown device 'tpu0'; use auto, cpu, cuda or cuda:N"):
        resolve_device("tpu0")
    if not torch.cuda.is_available():
        with pytest.raises(specdec.SpecDecError, match="no CUDA GPU.*use --device cpu"):
            resolve_device("cuda")


def test_load_places_the_model_and_picks_the_engine():
    model = specdec.load(tiny_model(), tokenizer=tiny_tokenizer(), device="cpu")
    assert model.device == torch.device("cpu")
    assert (model.engine, model.cuda_graphs) == ("dynamic", False)
    assert isinstance(model.start(PROMPT)[0], DynamicSession)
    with pytest.raises(specdec.SpecDecError, match="CUDA graphs need the model on a CUDA device"):
        model.configure("static", cuda_graphs=True)
    with pytest.raises(specdec.SpecDecError, match="engine must be one of dynamic, static"):
        model.configure("graph")


def test_a_draft_on_another_device_is_refused_before_any_forward_pass():
    target = load_tiny()
    draft = specdec.load(tiny_model().to("meta"), tokenizer=tiny_tokenizer(), name="meta-draft")
    with pytest.raises(specdec.SpecDecError, match="the draft 'meta-draft' is on meta but the target .* on cpu"):
        specdec.generate(target, PROMPT, draft=draft, max_new_tokens=4)


def test_int8_quantization_is_refused_on_a_gpu_with_the_fix():
    if torch.cuda.is_available():
        with pytest.raises(specdec.SpecDecError, match="runs on CPU only"):
            specdec.load(tiny_model(), tokenizer=tiny_tokenizer(), quantize="int8", device="cuda")
    else:
        with pytest.raises(specdec.SpecDecError, match="no CUDA GPU"):
            specdec.load(tiny_model(), tokenizer=tiny_tokenizer(), quantize="int8", device="cuda")

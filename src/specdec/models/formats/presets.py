"""The preset cache: a packaged GGUF model turned, once, into a local Hugging Face folder.

Presets are listed in :mod:`specdec.models.formats.catalog`. :func:`resolve_preset` finds a preset's GGUF parts
through the installed packages (``importlib.metadata``: nothing is imported, no network access is
needed or attempted), joins them, checks their sha256 and converts the file
(:mod:`specdec.models.formats.gguf_convert`) into ``cache_root()/models/<name>/``: ``config.json``, tokenizer
files with the chat template, a ``generation_config.json`` with the right end-of-sequence ids, and
the weights in the form they run in, each made the first time it is asked for (see :data:`VARIANTS`):

- ``bf16``: ``model.safetensors``, bfloat16 (the default dtype). specdec reads it into process memory
  (:func:`specdec.models.formats.checkpoint.load_dense`); ``AutoModelForCausalLM.from_pretrained(path)`` loads
  it too, like any local checkpoint;
- ``fp32``: ``model.fp32.safetensors``, the dequantized float32 values exactly (``dtype="fp32"``; a
  bfloat16 copy cannot give them back: most 4-bit GGUF values need more than bfloat16's 8 bits);
- ``int8`` / ``int8-tensor``: ``model.<method>.safetensors``, the dynamic int8 linear layers exactly as
  ``quantize_dynamic`` makes them from the float32 weights, and the other tensors in float32
  (:func:`specdec.models.formats.stored.load_quantized`).

Later calls find the file and return at once. Each file appears whole or not at all (written aside,
then renamed), and a lock keeps two processes from converting the same preset. :func:`preset_gguf`
keeps the joined GGUF file itself, for runtimes that read GGUF (llama.cpp).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from importlib import metadata

from specdec.devices import cache_root
from specdec.errors import ModelPackageMissing, SpecDecError
from specdec.models.formats.catalog import PRESETS, VARIANTS, Preset, get_preset
from specdec.models.formats.gguf_convert import convert_in_child as _convert  # a name of this module: tests replace it

__all__ = ["PRESETS", "Preset", "VARIANTS", "cache_root", "converted_folder", "preset_gguf", "resolve_preset"]

#: Name of the file written last into a converted folder; its presence means the folder is complete.
MARKER_FILE = "specdec_preset.json"
#: Bump when the conversion changes in a way that should redo existing folders.
#: 1: one float32 ``model.safetensors``. 2: one file per variant (:data:`VARIANTS`), made on demand.
FORMAT_VERSION = 2

_CHUNK_SIZE = 8 * 1024 * 1024  # bytes read at a time while joining and hashing the parts


def resolve_preset(
    name: str, *, cache_dir: pathlib.Path | None = None, progress: bool = True, variant: str = "bf16"
) -> pathlib.Path:
    """Return a local Hugging Face model folder for preset ``name`` that holds the weights of
    ``variant`` (a key of :data:`VARIANTS`; the file is ``folder / VARIANTS[variant]``), converting
    on first use.

    The folder is ``<cache>/models/<name>`` where ``<cache>`` is ``cache_dir`` or :func:`cache_root`.
    The first call for a variant joins the packaged GGUF parts, checks their sha256, dequantizes the
    model and saves the variant; later calls return at once. A joined GGUF file of the preset already
    in ``<cache>/gguf/`` (from :func:`preset_gguf`, or copied there on a machine without the packages)
    is used in place of the packages. Each file appears whole or not at all
    (written aside, then renamed).

    Raises:
        SpecDecError: ``name`` is not a preset, the packaged file is corrupt, or there is no room.
        ModelPackageMissing: a package the preset needs is not installed (the message has the
            ``pip`` command that installs it).
    """
    preset = get_preset(name)
    if variant not in VARIANTS:
        raise SpecDecError(f"unknown preset variant {variant!r}; use one of: {', '.join(VARIANTS)}")
    weights = VARIANTS[variant]
    models_dir = _cache_folder(cache_dir, "models")
    final = models_dir / preset.name
    if _is_complete(final, preset) and (final / weights).is_file():
        return final

    models_dir.mkdir(parents=True, exist_ok=True)
    with _lock(models_dir / f".{preset.name}.lock", preset.name, progress):
        base_ok = _is_complete(final, preset)
        if base_ok and (final / weights).is_file():  # another process finished it while we waited
            return final
        _remove_stale(models_dir, preset.name)
        joined = _joined_gguf(preset, cache_dir)
        parts = joined or _locate_parts(preset)
        _check_sizes(preset, parts)
        _check_disk_space(preset, models_dir, variant)
        if final.exists() and not base_ok:  # incomplete or from an older format: set aside, then rebuild
            broken = pathlib.Path(tempfile.mkdtemp(prefix=f".{preset.name}.partial-old-", dir=models_dir))
            os.replace(final, broken / "old")
        work = pathlib.Path(tempfile.mkdtemp(prefix=f".{preset.name}.partial-", dir=models_dir))
        try:
            started = time.monotonic()
            if progress:
                print(
                    f"specdec: converting preset {preset.name!r} ({variant}) once into {final} "
                    "(later runs load it directly)",
                    file=sys.stderr,
                )
            gguf_path = work / preset.gguf_name
            try:
                _join_and_verify(preset, parts, gguf_path, progress)
            except SpecDecError as err:
                if not joined:
                    raise
                raise SpecDecError(f"{joined[0]} is not the GGUF file of model preset {preset.name!r} (its sha256 "
                                   f"differs from {preset.sha256}): copy it again, or delete it to convert from "
                                   "the installed packages") from err
            staging = work / "model"
            _convert(preset, gguf_path, staging, progress, variant=variant, base=not base_ok)
            gguf_path.unlink()
            seconds = time.monotonic() - started
            if base_ok:  # add one file to a complete folder: atomic, the file is whole or absent
                os.replace(staging / weights, final / weights)
                _write_marker(preset, final, variant, seconds)
            else:
                _write_marker(preset, staging, variant, seconds)
                os.replace(staging, final)  # atomic: `final` either does not exist or is complete
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _remove_stale(models_dir, preset.name)
    return final


def converted_folder(name: str, *, cache_dir: pathlib.Path | None = None) -> pathlib.Path | None:
    """The folder of preset ``name`` if a conversion already made it (config and tokenizer are there,
    whichever variants it holds), else None. Converts nothing."""
    preset = get_preset(name)
    folder = _cache_folder(cache_dir, "models") / preset.name
    return folder if _is_complete(folder, preset) else None


def _cache_folder(cache_dir: pathlib.Path | None, name: str) -> pathlib.Path:
    """``<cache>/<name>``, ``<cache>`` being ``cache_dir`` or :func:`cache_root`: ``models`` holds converted
    presets, ``gguf`` joined GGUF files."""
    return pathlib.Path(cache_dir if cache_dir is not None else cache_root()).expanduser() / name


def preset_gguf(name: str, *, cache_dir: pathlib.Path | None = None, progress: bool = True) -> pathlib.Path:
    """Return the preset's original GGUF file (joined from its packages, sha256-checked), for runtimes
    that read GGUF directly (llama.cpp). Kept in ``<cache>/gguf/``; later calls return at once.

    Raises the same errors as :func:`resolve_preset`.
    """
    preset = get_preset(name)
    folder = _cache_folder(cache_dir, "gguf")
    final = folder / preset.gguf_name
    if final.is_file() and final.stat().st_size == preset.size:
        return final
    folder.mkdir(parents=True, exist_ok=True)
    with _lock(folder / f".{preset.name}.lock", preset.name, progress):
        if final.is_file() and final.stat().st_size == preset.size:
            return final
        parts = _locate_parts(preset)
        _check_sizes(preset, parts)
        partial = folder / f".{preset.gguf_name}.partial"
        try:
            _join_and_verify(preset, parts, partial, progress)
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)
    return final


def _joined_gguf(preset: Preset, cache_dir: pathlib.Path | None) -> list[pathlib.Path] | None:
    """The preset's joined GGUF file in ``<cache>/gguf/`` as its one part, when one of the right size is there
    (made by :func:`preset_gguf`, or copied in on a machine without the packages); else None.

    Its sha256 is checked while it is copied, as the packages' parts are.
    """
    path = _cache_folder(cache_dir, "gguf") / preset.gguf_name
    return [path] if path.is_file() and path.stat().st_size == preset.size else None


def _is_complete(folder: pathlib.Path, preset: Preset) -> bool:
    marker = folder / MARKER_FILE
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return (
        info.get("sha256") == preset.sha256
        and info.get("format_version") == FORMAT_VERSION
        and (folder / "config.json").is_file()
    )


@contextlib.contextmanager
def _lock(path: pathlib.Path, name: str, progress: bool):
    """Hold an exclusive lock on ``path`` so that two processes do not convert the same preset."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: rely on the atomic rename alone
        yield
        return
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"specdec: waiting for another process converting {name!r}...", file=sys.stderr)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale(models_dir: pathlib.Path, name: str) -> None:
    """Remove work folders left by an interrupted conversion (called with the lock held)."""
    for leftover in models_dir.glob(f".{name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _locate_parts(preset: Preset) -> list[pathlib.Path]:
    """Paths of the preset's GGUF parts, in join order, found through the package metadata."""
    dists: dict[str, metadata.Distribution] = {}
    missing: list[str] = []
    for dist_name, version in preset.packages:
        try:
            dists[dist_name] = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            missing.append(f"{dist_name}=={version}")
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelPackageMissing(
            f"Model preset {preset.name!r} needs packages that are not installed: {shown}. "
            f"Install them with:\n    {preset.pip_command}"
        )
    paths: list[pathlib.Path] = []
    for dist_name, rel in preset.parts:
        dist = dists[dist_name]
        entry = next((f for f in (dist.files or ()) if f.as_posix() == rel), None)
        path = pathlib.Path(dist.locate_file(entry if entry is not None else rel))
        if not path.is_file():
            raise ModelPackageMissing(
                f"Model preset {preset.name!r}: package {dist_name} {dist.version} is installed but "
                f"its file {rel} is missing. Reinstall it with:\n    "
                f"{_reinstall_command(preset)}"
            )
        paths.append(path)
    return paths


def _reinstall_command(preset: Preset) -> str:
    return preset.pip_command.replace("pip install ", "pip install --force-reinstall --no-cache-dir ", 1)


def _installed_versions(preset: Preset) -> str:
    out = []
    for dist_name, version in preset.packages:
        try:
            have = metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            have = "missing"
        if have != version:
            out.append(f"{dist_name} {have} (expected {version})")
    return ("; installed versions differ: " + ", ".join(out)) if out else ""


def _corrupt(preset: Preset, detail: str) -> SpecDecError:
    return SpecDecError(
        f"The packaged GGUF file of model preset {preset.name!r} is corrupt: {detail}"
        f"{_installed_versions(preset)}. Reinstall its packages with:\n    {_reinstall_command(preset)}"
    )


def _check_sizes(preset: Preset, parts: list[pathlib.Path]) -> None:
    total = sum(p.stat().st_size for p in parts)
    if total != preset.size:
        raise _corrupt(preset, f"its {len(parts)} part file(s) hold {total} bytes, expected {preset.size}")


def _check_disk_space(preset: Preset, models_dir: pathlib.Path, variant: str = "bf16") -> None:
    per_param = {"fp32": 4, "bf16": 2}.get(variant, 2)  # int8 / int4: 1 / 0.6 byte a linear weight, float32 embeddings
    need = preset.size + per_param * preset.params  # joined GGUF + the weights
    free = shutil.disk_usage(models_dir).free
    if free < need:
        raise SpecDecError(
            f"Not enough disk space to convert model preset {preset.name!r}: it needs about "
            f"{need / 2**30:.1f} GiB in {models_dir}, and {free / 2**30:.1f} GiB are free. Free some "
            "space, or point SPECDEC_CACHE (or cache_dir=) at a larger disk."
        )


def _join_and_verify(preset: Preset, parts: list[pathlib.Path], out: pathlib.Path, progress: bool) -> None:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with (
        open(out, "wb") as dst,
        tqdm(
            total=preset.size,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=f"{preset.name}: joining {len(parts)} part(s)",
            disable=not progress,
        ) as bar,
    ):
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(_CHUNK_SIZE):
                    digest.update(block)
                    dst.write(block)
                    bar.update(len(block))
    got = digest.hexdigest()
    if got != preset.sha256:
        raise _corrupt(preset, f"sha256 of the joined file is {got}, expected {preset.sha256}")



def _write_marker(preset: Preset, folder: pathlib.Path, variant: str, seconds: float) -> None:
    """Write (or, in a complete folder, update) the marker file; replaced atomically."""
    import transformers

    try:
        old = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        old = {}
    variants = old.get("variants", {}) if old.get("format_version") == FORMAT_VERSION else {}
    variants[variant] = {"file": VARIANTS[variant], "convert_seconds": round(seconds, 1)}
    info = {
        "preset": preset.name,
        "format_version": FORMAT_VERSION,
        "sha256": preset.sha256,
        "gguf_file": preset.gguf_name,
        "packages": [f"{d}=={v}" for d, v in preset.packages],
        "hf_repo": preset.hf_repo,
        "transformers_version": transformers.__version__,
        "variants": variants,
    }
    tmp = folder / f".{MARKER_FILE}.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER_FILE)

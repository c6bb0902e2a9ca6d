"""Build a C++ extension once per source and load it again from anywhere, with no rebuild.

torch's ``cpp_extension.load`` keys its cache folder by the name alone and re-runs ninja in every new process with
that process's paths (the sources' folder, the venv's torch headers): two checkouts, a venv reached through a
symlink or a ``git checkout`` that touches file times rebuild it, silently. Here the extension lives in a folder
keyed by the content of its sources and headers, its flags, torch's version and the Python ABI
(``$SPECDEC_KERNEL_DIR``, else ``<specdec cache>/kernels/<name>_<key>``), built from copies of the sources in that
folder, and once built it is imported straight from its ``.so``: ninja never runs again for it.

A build says so on stderr first, with a progress line while it runs. Builders of one folder take a file lock
(``fcntl``: the kernel drops it when a builder dies), so a torch ``lock`` file found under that lock was left by a
killed build: it is removed, with a message (torch would wait for it forever).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from specdec.devices import cache_root

ENV_DIR = "SPECDEC_KERNEL_DIR"
#: What a finished build leaves in its folder (its key's inputs): without it the folder is rebuilt.
DONE = "built.json"
#: Seconds between the progress lines of a build.
PROGRESS_EVERY = 15.0
#: A build of other sources not loaded for this long is removed when a new build is made (another checkout may still
#: load the builds beside it; each load stamps its folder's DONE file). A build that never finished (killed) goes
#: after an hour, when no builder holds its lock.
UNUSED_DAYS = 30
UNFINISHED_SECONDS = 3600


def kernel_root() -> Path:
    """Where built extensions live: ``$SPECDEC_KERNEL_DIR``, else ``kernels/`` in specdec's cache."""
    raw = os.environ.get(ENV_DIR, "").strip()
    if raw:
        return Path(raw).expanduser()
    return cache_root() / "kernels"


def build_key(sources: Sequence[Path], headers: Sequence[Path], cflags: Sequence[str], ldflags: Sequence[str]) -> str:
    """12 hex digits over what decides the built code: each file's name and bytes, the flags, torch's version and
    the extension suffix (the Python ABI). Not the paths: the same sources anywhere give the same key."""
    digest = hashlib.sha256()
    for path in list(sources) + list(headers):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    facts = [*cflags, "|", *ldflags, "|", torch.__version__, str(sysconfig.get_config_var("EXT_SUFFIX"))]
    digest.update("\0".join(facts).encode())
    return digest.hexdigest()[:12]


def _import(name: str, so: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, so)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {so}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _builders_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` held while building (released by the kernel if the process dies)."""
    try:
        import fcntl
    except ImportError:  # (not on Windows: no lock, torch's own baton only)
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _progress(what: str) -> Iterator[None]:
    """A line on stderr now and every :data:`PROGRESS_EVERY` seconds until the block ends."""
    start, done = time.monotonic(), threading.Event()
    print(f"specdec: building {what} once for this machine (about a minute on 2 cores; later runs load them)",
          file=sys.stderr, flush=True)

    def tick() -> None:
        while not done.wait(PROGRESS_EVERY):
            print(f"specdec: still building {what} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    print(f"specdec: built {what} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def load(name: str, sources: Sequence[Path], headers: Sequence[Path] = (), cflags: Sequence[str] = (),
         ldflags: Sequence[str] = (), what: str = "the CPU kernels") -> Any:
    """The extension ``name`` built from ``sources`` (C++ files compiled; ``headers`` they include, copied beside
    them), imported from its folder if built there, else built there first. Raises what the build raised."""
    key = build_key(sources, headers, cflags, ldflags)
    module_name = f"{name}_{key}"
    root = kernel_root()
    folder = root / module_name
    so = folder / f"{module_name}.so"  # (torch's name for what it builds)
    if (folder / DONE).exists() and so.exists():
        return _loaded(module_name, folder, so)
    root.mkdir(parents=True, exist_ok=True)
    with _builders_lock(root / f"{module_name}.lock"):
        if (folder / DONE).exists() and so.exists():  # built by another process while this one waited
            return _loaded(module_name, folder, so)
        stale = folder / "lock"  # torch's baton: no live builder holds it while this process holds the lock
        if stale.exists():
            print(f"specdec: removing a stale build lock ({stale}) left by a build that was killed; building again",
                  file=sys.stderr, flush=True)
            stale.unlink()
        copies = folder / "src"
        copies.mkdir(parents=True, exist_ok=True)
        for path in list(sources) + list(headers):
            shutil.copyfile(path, copies / path.name)
        from torch.utils import cpp_extension

        with _progress(what), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch's notes on the compiler's ABI)
            module = cpp_extension.load(module_name, [str(copies / s.name) for s in sources],
                                        extra_cflags=list(cflags), extra_ldflags=list(ldflags),
                                        build_directory=str(folder), verbose=False)
        (folder / DONE).write_text(json.dumps({"sources": [s.name for s in sources], "torch": torch.__version__,
                                               "cflags": list(cflags), "ldflags": list(ldflags)}, indent=1) + "\n")
    prune(root, name, keep=folder)
    return module


def _loaded(module_name: str, folder: Path, so: Path) -> Any:
    """The built module, its folder stamped as used now (what :func:`prune` reads)."""
    try:
        os.utime(folder / DONE)
    except OSError:  # (a read-only cache: the stamp is only a hint)
        pass
    return _import(module_name, so)


def prune(root: Path, name: str, keep: Path, now: float | None = None) -> list[Path]:
    """Remove the builds of ``name`` under ``root`` other than ``keep`` that were not loaded for :data:`UNUSED_DAYS`
    days, and unfinished ones older than :data:`UNFINISHED_SECONDS` that no builder holds; says what it removed."""
    now = time.time() if now is None else now
    removed = []
    for folder in sorted(root.glob(f"{name}_*")):
        if folder == keep or not folder.is_dir():
            continue
        done = folder / DONE
        if done.exists():
            old = now - done.stat().st_mtime > UNUSED_DAYS * 86400
        else:
            old = now - folder.stat().st_mtime > UNFINISHED_SECONDS and not _held(root / f"{folder.name}.lock")
        if old:
            shutil.rmtree(folder, ignore_errors=True)
            (root / f"{folder.name}.lock").unlink(missing_ok=True)
            removed.append(folder)
    if removed:
        print(f"specdec: removed {len(removed)} old kernel build(s) from {root} (unused for {UNUSED_DAYS} days, or "
              "never finished)", file=sys.stderr, flush=True)
    return removed


def _held(lock: Path) -> bool:
    """Whether a live builder holds ``lock`` (False where there is no such file, or no fcntl)."""
    try:
        import fcntl
    except ImportError:
        return False
    if not lock.exists():
        return False
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False

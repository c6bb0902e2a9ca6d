"""The CPU kernels' build: one folder per source content, loaded again from anywhere without ninja; a build killed
half-way leaves a lock that the next run clears, says so, and builds again; a failed build is a clear error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.models.kernels import extension

from specdec.models.kernels import build

TINY = """#include <torch/extension.h>
int64_t twice(int64_t x) { return 2 * x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""

BUILD = """
import sys
from pathlib import Path
from specdec.models.kernels import build
module = build.load("specdec_tiny", [Path(sys.argv[1])], what="a tiny extension")
print("twice(21) =", module.twice(21), flush=True)
"""


def _source(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.cpp"
    path.write_text(TINY)
    return path


def test_the_key_is_the_content_not_the_path(tmp_path):
    a, b = _source(tmp_path / "checkout_a"), _source(tmp_path / "checkout_b")
    assert build.build_key([a], [], ["-O3"], []) == build.build_key([b], [], ["-O3"], [])
    assert build.build_key([a], [], ["-O3"], []) != build.build_key([a], [], ["-O2"], [])
    b.write_text(TINY + "// changed\n")
    assert build.build_key([a], [], ["-O3"], []) != build.build_key([b], [], ["-O3"], [])


def test_the_real_kernels_load_from_their_folder_without_a_build(monkeypatch, capsys):
    """What every process after the first does: the built .so imported directly, no ninja, nothing said."""
    if not extension.cpu_supported():
        pytest.skip("this CPU runs no specdec kernel")
    extension.loaded()  # built (make test-setup builds it)
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("the kernels were rebuilt"))
    again = build.load("specdec_cpu_kernels", extension.SOURCES, extension.HEADERS, extension.CFLAGS,
                              extension.LDFLAGS)
    assert again.avx2_calls() >= 0 and "building" not in capsys.readouterr().err


def test_a_killed_build_is_followed_by_one_that_clears_its_lock_and_builds(tmp_path):
    """A build killed half-way (its process group: python, ninja, the compiler) leaves torch's lock file, which
    torch would wait on forever; the next run says it removes it and builds. Then a copy of the source elsewhere
    (another checkout) loads what was built, without building."""
    env = {**os.environ, build.ENV_DIR: str(tmp_path / "kernels")}
    source = _source(tmp_path / "checkout_a")
    killed = subprocess.Popen([sys.executable, "-c", BUILD, str(source)], env=env, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert "specdec: building a tiny extension once for this machine" in killed.stderr.readline()
    def folders() -> list[Path]:
        return [f for f in (tmp_path / "kernels").glob("specdec_tiny_*") if f.is_dir()]

    deadline = time.monotonic() + 60
    while not any((f / "lock").exists() for f in folders()) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the compiler is running
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    (folder,) = folders()
    assert (folder / "lock").exists() and not (folder / build.DONE).exists()

    after = subprocess.run([sys.executable, "-c", BUILD, str(source)], env=env, capture_output=True, text=True,
                           timeout=600)
    assert after.returncode == 0, after.stderr
    assert "removing a stale build lock" in after.stderr and "left by a build that was killed" in after.stderr
    assert "twice(21) = 42" in after.stdout and (folder / build.DONE).exists()

    other = _source(tmp_path / "checkout_b")
    again = subprocess.run([sys.executable, "-c", BUILD, str(other)], env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "twice(21) = 42" in again.stdout
    assert "building" not in again.stderr


def test_a_failed_build_names_the_fix(tmp_path, monkeypatch):
    """No working compiler: the kernels' error says what to install (and the defaults then run without them:
    tests/test_no_kernels.py)."""
    monkeypatch.setenv(build.ENV_DIR, str(tmp_path / "kernels"))
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setattr(extension, "_extension", None)
    monkeypatch.setattr(extension, "_failure", None)
    if not extension.cpu_supported():
        pytest.skip("this CPU runs no specdec kernel")
    error = extension.build_error()
    assert error is not None and error.startswith("could not build specdec's CPU kernels")
    assert "install a C++ compiler" in error and "pip install ninja" in error


def test_old_builds_go_when_a_new_one_is_made_and_used_ones_stay(tmp_path, capsys):
    """prune: a build not loaded for 30 days goes, one loaded since stays (another checkout's), a killed build's
    folder goes after an hour unless a builder holds its lock, other extensions' builds are not touched."""
    import fcntl

    now = time.time()

    def made(name: str, done_age_days: float | None, age_s: float = 0.0) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        if done_age_days is not None:
            (folder / build.DONE).write_text("{}")
            os.utime(folder / build.DONE, (now - done_age_days * 86400,) * 2)
        os.utime(folder, (now - age_s,) * 2)
        return folder

    keep = made("ext_new", 0)
    unused, used = made("ext_old", 31), made("ext_other_checkout", 2)
    killed, building = made("ext_killed", None, age_s=7200), made("ext_building", None, age_s=7200)
    young_kill, other = made("ext_just_killed", None, age_s=60), made("another_ext_old", 90)
    (tmp_path / "ext_old.lock").write_text("")
    with open(tmp_path / "ext_building.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # (a lock held by another open file description: flock conflicts within one process too)
        removed = build.prune(tmp_path, "ext", keep=keep, now=now)
    assert sorted(p.name for p in removed) == ["ext_killed", "ext_old"]
    assert not unused.exists() and not killed.exists() and not (tmp_path / "ext_old.lock").exists()
    assert all(p.exists() for p in (keep, used, building, young_kill, other))
    assert "removed 2 old kernel build(s)" in capsys.readouterr().err
    assert build.prune(tmp_path, "ext", keep=keep, now=now) == [building]  # its builder gone, it goes too
    assert build.prune(tmp_path, "ext", keep=keep, now=now) == []


def test_loading_a_build_stamps_it_as_used(tmp_path):
    """The stamp prune reads: loading a built folder sets its DONE file's time to now."""
    folder = tmp_path / "m_0"
    folder.mkdir()
    (folder / build.DONE).write_text("{}")
    os.utime(folder / build.DONE, (1.0, 1.0))
    so = folder / "m_0.so"
    so.write_text("")
    with pytest.raises(ImportError):  # (not a real module: the stamp comes first)
        build._loaded("m_0", folder, so)
    assert time.time() - (folder / build.DONE).stat().st_mtime < 60

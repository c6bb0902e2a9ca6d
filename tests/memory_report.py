"""How much memory each test process took (issue 42: no test process above 8 GB), printed after the tests,
and each module's memory handed back when it ends.

Each process (the one pytest, or each pytest-xdist worker) records its peak resident memory
(``getrusage(RUSAGE_SELF).ru_maxrss``) after every test, and the test file during which it last rose; the
largest child it waited for (the CLI runs and servers the tests start: ``RUSAGE_CHILDREN``) is reported
beside it (a child forked from a large process counts the parent's memory at the fork as its own). The workers hand their figures to the controller, which prints one line per process.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource

import pytest

_GIB = 1024 * 1024  # ru_maxrss is in KiB on Linux


class _Peaks:
    def __init__(self):
        self.self_kib = 0
        self.children_kib = 0
        self.self_file = ""
        self.children_file = ""

    def update(self, file: str) -> None:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if own > self.self_kib:
            self.self_kib, self.self_file = own, file
        if children > self.children_kib:
            self.children_kib, self.children_file = children, file

    def as_dict(self) -> dict:
        return {  # plain types: it crosses xdist's channel
            "self_kib": self.self_kib, "self_file": self.self_file,
            "children_kib": self.children_kib, "children_file": self.children_file,
        }


_LIBC = ctypes.CDLL(None)


def give_memory_back() -> None:
    """Collect what the module left and hand the allocator's free memory back to the system (glibc keeps the
    freed heap of a model: 2.2 GB after the int8 1.5B, measured), so that the next module of this process
    starts from what is alive, not from the last module's high-water mark."""
    gc.collect()
    trim = getattr(_LIBC, "malloc_trim", None)  # glibc's (the process's own symbols: no ldconfig subprocess)
    if trim is not None:
        trim(0)


@pytest.fixture(autouse=True, scope="module")
def _memory_back_after_each_module():
    yield  # (autouse: set up first, so torn down after the module's model fixtures are gone)
    give_memory_back()


_peaks = _Peaks()
_reports: dict[str, dict] = {}


def pytest_runtest_logfinish(nodeid, location):
    _peaks.update(nodeid.split("::")[0])


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its figures travel to the controller
        workeroutput["memory"] = _peaks.as_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    memory = getattr(node, "workeroutput", {}).get("memory")
    if memory is not None:
        _reports[node.gateway.id] = memory


def pytest_terminal_summary(terminalreporter):
    reports = dict(_reports)
    if not reports and _peaks.self_kib:
        reports[f"pid {os.getpid()}"] = _peaks.as_dict()
    if not reports:
        return
    terminalreporter.section("peak memory per test process")
    for name, m in sorted(reports.items()):
        terminalreporter.write_line(
            f"{name}: {m['self_kib'] / _GIB:.2f} GiB (reached in {m['self_file']}); largest child process "
            f"{m['children_kib'] / _GIB:.2f} GiB ({m['children_file'] or 'none'})"
        )

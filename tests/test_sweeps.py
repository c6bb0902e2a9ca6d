"""Sweeps as units of work: the same records serially and on a local Ray cluster, a lost worker retried.

The models are tiny ones saved to folders, so that Ray workers load them by name as a user's would.
"""

from __future__ import annotations

import argparse
import json

import pytest

from specdec import bench
from specdec import alpha
from specdec.errors import SpecDecError
from specdec.sweeps import RecordStore, Unit, execute, shards
from specdec.sweeps.units import flatten
from tiny import load_tiny, perturbed, tiny_tokenizer

ray = pytest.importorskip("ray", reason="specdec[ray] is part of the test extra")

PROMPTS = ["w1 w2 w3 w4", "w5 w6 w7 w8 w9 w10", "w11 w12", "w3 w3 w3 w3 w3"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny target and a perturbed copy (the draft) saved as model folders, and a prompts file."""
    root = tmp_path_factory.mktemp("sweep")
    target = load_tiny("llama", sharp=3.0)
    draft = perturbed(target, 0.3)
    for name, model in (("target", target.hf_model), ("draft", draft.hf_model)):
        model.save_pretrained(root / name)
        tiny_tokenizer().save_pretrained(root / name)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs, over the loopback."""
    from specdec.sweeps.on_ray import connect

    connect("local", num_cpus=2)
    yield
    ray.shutdown()


def alpha_args(folders, *extra):
    parser = argparse.ArgumentParser()
    alpha.add_arguments(parser)
    return parser.parse_args(["--target", str(folders / "target"), "--task", f"jsonl:{folders / 'prompts.jsonl'}",
                              "--n-prompts", "4", "--max-new-tokens", "8", "--drafts", str(folders / "draft"),
                              "prompt-lookup", "random", "--ngram-corpus", "prompt", "--temperatures", "0,1",
                              "--dtype", "fp32", "--threads", "1", *extra])


def bench_args(folders, *extra):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--target", str(folders / "target"), "--prompts-file", str(folders / "prompts.jsonl"),
                              "--n-prompts", "4", "--max-new-tokens", "8", "--draft", str(folders / "draft"),
                              "--methods", "specdec-plain,specdec-spec", "--gammas", "2,3", "--temperatures", "0,1",
                              "--warmup", "0", "--dtype", "fp32", "--threads", "1", *extra])


def without_times(document):
    """What of a bench document is not a time: tokens, acceptance, alpha, equality, per run and in total."""
    keep = ("runs", "new_tokens", "target_calls", "draft_calls", "drafted", "accepted", "acceptance_rate", "alpha",
            "mean_accepted_length", "acceptance_per_position", "quality")
    out = {}
    for t, block in document["by_temperature"].items():
        out[t] = {
            "methods": {name: {k: m.get(k) for k in keep} for name, m in block["methods"].items()},
            "outputs": block["outputs"],
            "identical_to_plain": block["identical_to_plain"],
            "runs": [{k: (v if not isinstance(v, dict) else {x: v[x] for x in ("new_tokens", "target_calls", "alpha",
                                                                               "mean_accepted_length") if x in v})
                      for k, v in run.items() if k not in ("load_average", "machine")} for run in block["runs"]],
        }
    return out


def test_shards_cover_every_prompt_once():
    assert shards(5, 2) == [(0, 1), (2, 3), (4,)]
    assert shards(3, None) == [(0, 1, 2)]
    with pytest.raises(SpecDecError, match="--shard-size must be >= 1"):
        shards(3, 0)


def test_unit_ids_depend_on_what_is_measured_not_where(folders):
    a = alpha_args(folders)
    units = alpha.plan(a, 4)
    assert len(units) == 2 * 4 and len({u.id for u in units}) == 8  # temperatures x shards of 1
    b = alpha_args(folders, "--records", "/elsewhere", "--ray", "auto")
    assert [u.id for u in alpha.plan(b, 4)] == [u.id for u in units]
    c = alpha_args(folders, "--seed", "7")
    assert not {u.id for u in alpha.plan(c, 4)} & {u.id for u in units}


def test_alpha_on_ray_equals_the_serial_run(folders, cluster):
    serial = alpha.run(alpha_args(folders), progress=False)
    on_ray = alpha.run(alpha_args(folders, "--ray"), progress=False)
    assert on_ray["config"]["units"] == serial["config"]["units"] == 8
    assert on_ray["config"]["ran_on"].startswith("Ray")
    assert on_ray["results"] == serial["results"]  # alpha, coverage, standard errors, per prompt: bit for bit
    assert on_ray["generations"] == serial["generations"]
    assert {r["draft"] for r in serial["results"]} == {str(folders / "draft"), "prompt-lookup", "random"}
    assert all(r["positions"] > 0 for r in serial["results"])


def test_a_ray_sweep_without_threads_runs_the_serial_runs_thread_count(folders, cluster):
    """Issue 42: without --threads a Ray unit ran 1 torch thread where the serial run used torch's own count (2
    on this project's machines), and its records differed in the last digits. Now it takes the serial count."""
    import torch

    from specdec.sweeps.options import sweep_threads

    assert sweep_threads(None) == torch.get_num_threads() and sweep_threads(3) == 3
    serial_args, ray_args = alpha_args(folders), alpha_args(folders, "--ray")
    serial_args.threads = ray_args.threads = None  # as parsed without --threads
    serial = alpha.run(serial_args, progress=False)
    on_ray = alpha.run(ray_args, progress=False)
    assert ray_args.threads == torch.get_num_threads()  # what each unit asked Ray for and ran with
    assert on_ray["results"] == serial["results"] and on_ray["generations"] == serial["generations"]


def test_bench_on_ray_equals_the_serial_run_but_for_times(folders, cluster, tmp_path):
    serial = bench.run(bench_args(folders, "--shard-size", "2"), progress=False)
    out = tmp_path / "out"
    on_ray = bench.run(bench_args(folders, "--shard-size", "2", "--ray", "--out", str(out)), progress=False)
    assert without_times(on_ray) == without_times(serial)
    assert serial["by_temperature"]["0"]["identical_to_plain"]  # the comparison ran
    assert all(c["all_equal"] for c in serial["by_temperature"]["0"]["identical_to_plain"].values())
    assert on_ray["costs"]["target_k1_s"] > 0 and on_ray["config"]["timing_note"].startswith("Ray sweep")
    # 2 temperatures x 2 shards + the costs: each unit's records kept once under its id, the runs logged
    assert len(list((out / "units").glob("*.jsonl"))) == 5
    assert len((out / "runs.jsonl").read_text().splitlines()) == 2 * 4


def dies_once(folder: str):
    """A unit runner whose worker process dies the first time it meets each unit (a lost machine)."""

    def run(unit):
        import os as _os
        from pathlib import Path as _Path

        from specdec.sweeps import run_unit

        marker = _Path(folder) / f"{unit.id}.died"
        if not marker.exists():
            marker.write_text(str(_os.getpid()))
            _os._exit(1)
        return run_unit(unit)

    return run


def test_a_killed_worker_is_retried_and_every_unit_kept_once(folders, cluster, tmp_path):
    args = alpha_args(folders, "--temperatures", "0")
    units = alpha.plan(args, 4)
    serial = flatten(execute(units, alpha.run_unit, progress=False))
    store = tmp_path / "records"
    markers = tmp_path / "markers"
    markers.mkdir()
    parts = execute(units, alpha.run_unit, ray="local", records=store, remote=dies_once(str(markers)), progress=False)
    assert len(list(markers.iterdir())) == len(units)  # every unit lost its worker once
    assert flatten(parts) == serial
    assert sorted(p.name for p in store.iterdir()) == sorted(f"{u.id}.jsonl" for u in units)
    # idempotent: a rerun over the same store runs nothing (a runner that would fail is never called)
    again = execute(units, lambda unit: pytest.fail("ran a finished unit"), records=store, progress=False)
    assert flatten(again) == serial


def test_the_store_writes_a_unit_once(tmp_path):
    unit = Unit("alpha", "prompts", {"seed": 0}, 0.0, (0,))
    store = RecordStore(tmp_path)
    store.write(unit, [{"a": 1}])
    store.write(unit, [{"a": 2}])  # a retried unit's second answer
    assert store.read(unit) == [{"a": 1}]
    assert not list(tmp_path.glob("*.tmp"))


def test_ray_refuses_loaded_models(folders):
    with pytest.raises(SpecDecError, match="--ray loads the models by name"):
        alpha.run(alpha_args(folders, "--ray"), target=load_tiny("llama"), progress=False)


def reports_loads():
    """A unit runner that says whether its worker process had the sweep's models loaded before the unit
    (made inside a function, so that Ray ships it by value: workers cannot import this test module)."""

    def run(unit):
        import os as _os

        from specdec import alpha as _alpha
        from specdec.sweeps.units import has_loaded

        had = has_loaded(unit)
        return _alpha.run_unit(unit) + [{"record": "worker", "pid": _os.getpid(), "had_models": had}]

    return run


def test_a_ray_worker_loads_a_sweeps_models_once(folders, cluster):
    """Ray tasks reuse worker processes; the per-process cache makes them cost what actors would: each
    worker loads the models for its first unit only."""
    # a seed of its own: workers reused from the module's other Ray tests hold those sweeps' models, not this one's
    units = alpha.plan(alpha_args(folders, "--temperatures", "0,1", "--seed", "7"), 4)
    parts = execute(units, alpha.run_unit, ray="local", remote=reports_loads(), progress=False)
    workers = [r for part in parts for r in part if r["record"] == "worker"]
    assert len(workers) == len(units) == 8
    pids = {w["pid"] for w in workers}
    assert len(pids) < len(units)  # workers were reused
    for pid in pids:
        assert sum(not w["had_models"] for w in workers if w["pid"] == pid) == 1, pid

"""specdec plot: the paper's figures and a measured run's speedup vs gamma as non-empty PNGs."""

import json

from specdec import cli
from specdec.publish import plots as plot

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    data = path.read_bytes()
    return data[:8] == PNG and len(data) > 5000


def test_theory_figures(tmp_path):
    paths = plot.theory_figures(tmp_path)
    assert [p.name for p in paths] == ["figure2_expected_tokens.png", "figure3_optimal_gamma.png", "table1.png"]
    assert all(is_png(p) for p in paths)


def test_table1_is_the_papers():
    rows = {(a, g): (round(ops, 2), round(speed, 2)) for a, g, ops, speed in plot.table1_rows()}
    assert rows[(0.8, 5)] == (1.63, 3.69) and rows[(0.9, 10)] == (1.60, 6.86) and rows[(0.6, 2)] == (1.53, 1.96)
    assert "| 0.8 | 5 | 1.63x | 3.69x |" in plot.table1_markdown()


def bench_result():
    rows = []
    for temperature in (0.0, 1.0):
        for gamma in (1, 2, 4):
            rows.append({"method": "specdec-spec", "schedule": "constant", "lenience": 1.0, "temperature": temperature,
                         "draft": "d", "gamma": gamma, "speedup_vs_specdec_plain": 1.0 + 0.1 * gamma,
                         "predicted_speedup": 1.1 + 0.1 * gamma})
        rows.append({"method": "specdec-plain", "temperature": temperature})
    return {"config": {"task": "humaneval", "target": "t"}, "rows": rows}


def test_speedup_vs_gamma(tmp_path):
    paths = plot.bench_figures(bench_result(), tmp_path)
    assert [p.name for p in paths] == ["speedup_vs_gamma_humaneval.png"] and is_png(paths[0])
    assert plot.bench_figures({"config": {"task": "x"}, "rows": []}, tmp_path) == []


def test_cli_plot(tmp_path, capsys):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench_result()))
    assert cli.main(["plot", "--out", str(tmp_path / "fig"), "--bench", str(path)]) == 0
    names = sorted(p.name for p in (tmp_path / "fig").iterdir())
    assert names == ["figure2_expected_tokens.png", "figure3_optimal_gamma.png", "speedup_vs_gamma_humaneval.png",
                     "table1.png"]
    assert cli.main(["plot", "--out", str(tmp_path / "f2"), "--bench", str(tmp_path / "missing.json")]) == 2

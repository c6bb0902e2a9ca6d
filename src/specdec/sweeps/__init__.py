"""Sweeps as units of work, run here or on a Ray cluster.

``specdec bench`` and ``specdec alpha`` plan their work as :class:`Unit` s (one configuration x one
shard of prompts, :mod:`specdec.sweeps.units`), run them in this process or as Ray tasks
(:mod:`specdec.sweeps.on_ray`, ``--ray``), and aggregate the plain records the units return.
"""

from specdec.sweeps.units import RecordStore, Unit, execute, plain_options, run_unit, shards

__all__ = ["Unit", "RecordStore", "execute", "plain_options", "run_unit", "shards", "add_arguments"]


def add_arguments(parser, *, shard_help: str) -> None:
    """The options every sweep command shares: where its units run, how big they are, where they are kept."""
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="run the units as Ray tasks (pip install 'specdec[ray]'): no ADDRESS starts a cluster on "
                             "this machine; 'auto' or 'ray://HOST:PORT' joins a running one. Each unit asks for "
                             "--threads CPUs (default 1 with --ray)")
    parser.add_argument("--shard-size", type=int, default=None, metavar="N", help=shard_help)
    parser.add_argument("--records", default=None, metavar="DIR",
                        help="keep each finished unit's records as DIR/<unit id>.jsonl, written once; a rerun with "
                             "the same DIR runs only the units not there yet")

"""Sweeps as units of work, run here or on a Ray cluster.

``specdec bench`` and ``specdec alpha`` plan their work as :class:`Unit` s (one configuration x one
shard of prompts, :mod:`specdec.sweeps.units`), run them (:mod:`specdec.sweeps.execution`) in this process
or as Ray tasks (:mod:`specdec.sweeps.on_ray`, ``--ray``), and aggregate the plain records the units return.
"""

from specdec.sweeps.execution import execute
from specdec.sweeps.units import RecordStore, Unit, plain_options, run_unit, shards

__all__ = ["Unit", "RecordStore", "execute", "plain_options", "run_unit", "shards"]

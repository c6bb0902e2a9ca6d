"""Units as Ray tasks: a sweep on a Ray cluster (``--ray [ADDRESS]``; the extra ``specdec[ray]``).

Each unit is one Ray task asking for ``num_cpus`` CPUs (``--threads``): Ray starts no more tasks on
a node than its CPUs hold, so the units that time things never share cores, and each task's torch
uses exactly that many threads. A worker process keeps the models it loaded
(:func:`specdec.sweeps.units.loaded_for`, per process and sweep), so the
tasks Ray gives the same worker load nothing again: tasks cost what actors would, and a lost worker
costs only its unit. A unit lost with its worker (killed, out of memory, a node gone) is retried
(:data:`RETRIES` times); a unit is idempotent, and its records are kept once under its id.

Timings compare within a unit (one worker, one run); alpha, accepted lengths, tokens and quality
pool across units.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from specdec.errors import SpecDecError
from specdec.sweeps.units import Records, Unit

#: Retries of a unit whose worker died (Ray's max_retries: system failures, not errors in the unit).
RETRIES = 3

TIMING_CAVEAT = ("Ray sweep: throughput figures compare methods within a unit (one worker, one run); alpha, "
                 "accepted lengths, tokens and quality pool across units.")


def _import_ray():
    try:
        import ray
    except ImportError:
        raise SpecDecError("--ray needs Ray: pip install 'specdec[ray]'") from None
    return ray


def _loopback_only(ray) -> None:
    """A cluster on this machine talks over the loopback only: Ray then takes 127.0.0.1 as the node's
    address (as it does on macOS and Windows) instead of the machine's network address, here and in the
    processes it starts (they read the variable)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time; the variable covers Ray's own processes


def connect(address: str, num_cpus: int | None = None) -> bool:
    """Join (or start) the cluster at ``address``: 'local' starts one on this machine (its CPUs, or
    ``num_cpus``); 'auto' or 'ray://host:port' joins a running one. Returns whether it was started
    here (and so is to be shut down here). An already initialized Ray is used as it is."""
    ray = _import_ray()
    if ray.is_initialized():
        return False
    options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address == "local":
        _loopback_only(ray)
        ray.init(num_cpus=num_cpus or os.cpu_count(), **options)
    else:
        try:
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SpecDecError(f"cannot join the Ray cluster at {address!r}: {e}; start one with `ray start "
                               "--head`, or give --ray with no address for a cluster on this machine") from None
    return True


def run_on_ray(units: Sequence[Unit], fn: Callable[[Unit], Records], *, address: str, num_cpus: int,
               arrived: Callable[[Unit, Records], None]) -> None:
    """Run every unit as a Ray task of ``fn``; ``arrived(unit, records)`` as each one finishes."""
    if not units:
        return
    ray = _import_ray()
    started = connect(address)
    try:
        available = ray.cluster_resources().get("CPU", 0)
        if available < num_cpus:
            raise SpecDecError(f"each unit asks for {num_cpus} CPUs (--threads) but the Ray cluster has {available:g}; "
                               "lower --threads or add nodes")
        task = ray.remote(num_cpus=num_cpus, max_retries=RETRIES, retry_exceptions=False)(fn)
        pending = {task.remote(unit): unit for unit in units}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            unit = pending.pop(ready[0])
            try:
                records = ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:  # the unit itself failed: its own error, as in a serial run
                raise e.as_instanceof_cause() from None
            except ray.exceptions.WorkerCrashedError:
                raise SpecDecError(f"unit {unit.id} lost its worker {RETRIES + 1} times; see the Ray logs") from None
            arrived(unit, records)
    finally:
        if started:
            ray.shutdown()

"""One generation at a time: a worker thread, a bounded first-in-first-out queue, cancellation.

The loaded models are used by one generation at a time (their KV sessions are per generation, but two
generations would share the CPU or GPU and slow each other down). Requests are admitted in arrival order
into a queue of at most ``max_queue`` waiting jobs behind the running one; a request that finds the
queue full is refused (:class:`QueueFull`, HTTP 429) instead of waiting without bound.

A job is cancelled (client gone, or past its deadline) through :meth:`Job.cancel` from the event loop;
the worker notices it at the next accepted group of tokens (``on_tokens`` raises :class:`Cancelled`,
which propagates out of :func:`specdec.generate`), or before the job starts.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from specdec.errors import SpecDecError

log = logging.getLogger("specdec.serve")


class Cancelled(Exception):
    """Raised on the worker thread to stop a generation; reason: 'disconnected' or 'timeout'."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class QueueFull(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"queue full, retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass(eq=False)
class Job:
    """A unit of work for the worker thread, and the channel of its events back to the event loop.

    run(job) executes on the worker thread and returns the result (delivered as ("done", result));
    it may call job.emit(kind, payload) for intermediate events and job.check() to honour cancellation.
    Events arrive in job.events (an asyncio.Queue on the loop that created the job): ("done", result),
    ("error", exception) or ("cancelled", reason), after any intermediate ones.
    """

    run: Callable[["Job"], Any]
    deadline: float  # time.monotonic() after which the job is abandoned
    # batched serving (BatchWorker): start_row(job) -> (engine, row) adds the job's row to the batch;
    # finish_row(row) -> the "done" payload once the row finished
    start_row: Callable[["Job"], tuple[Any, Any]] | None = None
    finish_row: Callable[[Any], Any] | None = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None
    _cancel: str | None = None

    def cancel(self, reason: str) -> None:
        if self._cancel is None:
            self._cancel = reason

    def check(self) -> None:
        if self._cancel is not None:
            raise Cancelled(self._cancel)
        if time.monotonic() > self.deadline:
            raise Cancelled("timeout")

    def emit(self, kind: str, payload: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop has closed (server shutting down)
            pass


class Worker:
    """Runs jobs one at a time, in arrival order, on one thread; at most ``max_queue`` wait."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.waiting = 0
        self.running = 0
        self.counts = {"completed": 0, "cancelled": 0, "timed_out": 0, "failed": 0, "rejected": 0}
        self._mean_seconds = 1.0  # running mean of job durations, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="specdec-worker", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the worker thread before any job submitted later (model loading)."""
        self._queue.put(fn)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.waiting >= self.max_queue:
                self.counts["rejected"] += 1
                raise QueueFull(max(1, round(self._mean_seconds * (self.waiting + self.running))))
            self.waiting += 1
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"running": self.running, "waiting": self.waiting, "max_queue": self.max_queue, **self.counts}

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, Job):
                self._execute(item)
            else:
                item()

    def _execute(self, job: Job) -> None:
        with self._lock:
            self.waiting -= 1
            self.running = 1
        outcome = "failed"
        try:
            job.check()  # cancelled or expired while it waited
            job.started = time.monotonic()
            result = job.run(job)
            outcome = "completed"
            job.emit("done", result)
        except Cancelled as err:
            outcome = "timed_out" if err.reason == "timeout" else "cancelled"
            job.emit("cancelled", err.reason)
        except Exception as err:  # reported to the client as an error object; the worker goes on
            if not isinstance(err, SpecDecError):
                log.exception("generation failed")
            job.emit("error", err)
        finally:
            with self._lock:
                self.running = 0
                self.counts[outcome] += 1
                if job.started is not None:
                    self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.monotonic() - job.started)


class BatchWorker(Worker):
    """Runs jobs as rows of one batch (:class:`specdec.batch.engine.BatchEngine`), up to the engine's max_batch at
    once, on one thread: between rounds, waiting jobs join the batch (continuous batching), cancelled or
    expired rows leave, finished rows deliver their results. At most ``max_queue`` jobs wait for a row."""

    def __init__(self, max_queue: int, max_batch: int):
        self.max_batch = max_batch
        self._rows: dict[Any, Job] = {}  # running row -> its job
        self._engine: Any = None
        super().__init__(max_queue)

    def snapshot(self) -> dict[str, Any]:
        engine = self._engine
        return {**super().snapshot(), "max_batch": self.max_batch,
                **({"batch": engine.report()} if engine is not None and hasattr(engine, "report") else {})}

    def _loop(self) -> None:
        while True:
            item: Any = ()  # nothing taken: run a round
            if len(self._rows) < self.max_batch:  # a full batch leaves the queue waiting
                try:
                    item = self._queue.get_nowait() if self._rows else self._queue.get()
                except queue.Empty:
                    pass
            if item is None:
                return
            if isinstance(item, Job):
                self._admit(item)  # and take the next waiting job, if any, before the round
            elif item != ():
                item()
            elif self._rows:
                self._round()

    def _admit(self, job: Job) -> None:
        with self._lock:
            self.waiting -= 1
        try:
            job.check()
            job.started = time.monotonic()
            engine, row = job.start_row(job)
        except Cancelled as err:
            self._finished(job, "timed_out" if err.reason == "timeout" else "cancelled", ("cancelled", err.reason))
            return
        except Exception as err:
            self._finished(job, "failed", ("error", err))
            return
        self._engine = engine
        self._rows[row] = job
        with self._lock:
            self.running = len(self._rows)

    def _round(self) -> None:
        engine = self._engine
        for row, job in self._rows.items():  # cancelled (client gone) or past its deadline: leaves now
            try:
                job.check()
            except Cancelled as err:
                engine.cancel(row, err.reason)
                row.error = err
        try:
            finished = engine.step()
        except Exception as err:  # a failure of the batch itself: every row reports it
            log.exception("batched generation failed")
            finished = list(self._rows)
            for row in finished:
                row.error = row.error or err
                if row in engine.rows:
                    engine.cancel(row, "failed")
            engine.step()  # the cancelled rows leave
        for row in finished:
            job = self._rows.pop(row, None)
            if job is None:
                continue
            error = row.error
            if error is None:
                self._finished(job, "completed", ("done", job.finish_row(row)))
            elif isinstance(error, Cancelled):
                self._finished(job, "timed_out" if error.reason == "timeout" else "cancelled", ("cancelled", error.reason))
            else:
                if not isinstance(error, SpecDecError):
                    log.error("generation failed: %s", error)
                self._finished(job, "failed", ("error", error))
        with self._lock:
            self.running = len(self._rows)

    def _finished(self, job: Job, outcome: str, event: tuple[str, Any]) -> None:
        job.emit(*event)
        with self._lock:
            self.counts[outcome] += 1
            if job.started is not None:
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.monotonic() - job.started)

"""``specdec serve``: an OpenAI-compatible HTTP server over :func:`specdec.generate`.

Layout: ``protocol`` (request fields -> a validated generation; responses and stream chunks), ``stream``
(streamed text that never shows a stop string), ``ui`` (the playground page's static files), ``worker`` (one generation at a time, bounded FIFO queue,
cancellation), ``app`` (Starlette routes), and :func:`run` here (uvicorn). Needs the ``serve`` extra:
``pip install 'specdec[serve]'``.
"""

from __future__ import annotations

import logging
from typing import Callable

from specdec.errors import SpecDecError
from specdec.serve.protocol import Served

__all__ = ["Served", "run"]


def run(load: Callable[[], Served], *, host: str = "127.0.0.1", port: int = 8000, max_queue: int = 16,
        api_key: str | None = None, log_level: str = "info", ui: bool = True, max_batch: int = 1) -> None:
    """Serve until interrupted. ``load`` runs once, at start-up; if it fails the server stops and the
    error is raised here."""
    try:
        import uvicorn

        from specdec.serve.app import create_app
    except ImportError:
        raise SpecDecError("specdec serve needs its extra: pip install 'specdec[serve]'") from None
    failure: list[BaseException] = []

    def stop(err: BaseException) -> None:
        failure.append(err)
        server.should_exit = True

    app = create_app(load, max_queue=max_queue, api_key=api_key, on_load_error=stop, ui=ui, max_batch=max_batch)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=5))
    ours = logging.getLogger("specdec.serve")
    ours.handlers, ours.propagate = logging.getLogger("uvicorn.error").handlers, False
    ours.setLevel(log_level.upper())
    server.run()
    if failure:
        err = failure[0]
        raise err if isinstance(err, SpecDecError) else SpecDecError(f"loading the models failed: {err}")

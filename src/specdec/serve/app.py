"""The HTTP application (Starlette): routes, API key, error objects, server-sent events.

GET  /                     the playground page (static files in specdec/serve/ui; off with ui=False, --no-ui)
GET  /health               200 {"status": "ready", queue counters} once the models are loaded, 503 before
GET  /v1/models            the one served model
POST /v1/completions       text completion; "stream": true sends one event per accepted group of tokens
POST /v1/chat/completions  the same through the model's chat template

Every error is an OpenAI error object with its status (400 bad request, 401 API key, 429 queue full with
Retry-After, 503 still loading, 504 past the request's timeout, 500 a bug), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import specdec
from specdec.decoding import RoundEvent
from specdec.errors import SpecDecError
from specdec.serve.protocol import APIError, GenerationRequest, Reply, Served, finish_reason, parse_json, parse_request, sse
from specdec.serve.stream import TextStream
from specdec.serve.worker import BatchWorker, Job, QueueFull, Worker

log = logging.getLogger("specdec.serve")

CLIENT_CLOSED = 499  # nginx's status for a request whose client went away (never seen by that client)


UI = Path(__file__).parent / "ui"


def _rejected_text(decode: Callable[[list], str], before: list[int], rejected: list[int]) -> str:
    """The text of a round's rejected draft tokens as they would have read after ``before`` (the last few
    tokens of the text they were proposed to continue: leading spaces depend on the context)."""
    if not rejected:
        return ""
    head, whole = decode(before), decode(before + rejected)
    return whole[len(head):] if whole.startswith(head) else decode(rejected)


def _callbacks(served: Served, request: GenerationRequest, job: Job):
    """(on_tokens, on_round, finish) of a request's generation on the worker thread: on_tokens honours
    cancellation; on_round (streaming) also emits ("tokens", chunk extension) per target call; finish(out)
    -> the "done" payload (output, the text not streamed yet, seconds spent in the queue)."""
    decode = served.target.decode
    stream = TextStream(decode, request.config.stop) if request.stream else None
    context = request.prompt_ids[-8:]  # the text's last tokens, for decoding rejected drafts in place

    def on_tokens(ids: list[int], from_draft: list[bool]) -> None:
        job.check()  # raises Cancelled: the client left, or the deadline passed

    def on_round(event: RoundEvent) -> None:
        job.check()
        k = sum(event.from_draft)
        draft_text, target_text = stream.push(event.tokens[:k]), stream.push(event.tokens[k:])
        rejected_text = _rejected_text(decode, context + event.tokens[:k], event.rejected)
        context[:] = (context + event.tokens)[-8:]
        job.emit("tokens", {"tokens": len(event.tokens), "from_draft": k, "drafted": len(event.drafted),
                            "draft_text": draft_text, "target_text": target_text, "rejected_text": rejected_text,
                            "from_prediction": event.source == "prediction"})

    def finish(out: Any) -> tuple[Any, str, float]:
        return out, stream.finish(out.text) if stream is not None else "", job.started - job.arrived

    return (on_tokens if stream is None else None), (on_round if stream is not None else None), finish


def _run_generation(served: Served, request: GenerationRequest, job: Job) -> tuple[Any, str, float]:
    """On the worker thread: generate, emitting ("tokens", chunk extension) per target call when streaming
    (:func:`round_chunk`); returns (output, the text not streamed yet, seconds spent in the queue)."""
    on_tokens, on_round, finish = _callbacks(served, request, job)
    out = specdec.generate(served.target, request.prompt_ids, draft=request.draft, config=request.config,
                           on_tokens=on_tokens, on_round=on_round)
    return finish(out)


def _start_row(served: Served, request: GenerationRequest, job: Job) -> tuple[Any, Any]:
    """On the batch worker's thread: the request as a row of the served batch (:class:`specdec.BatchEngine`);
    (engine, row). The row's draft: the served model, none, or its own parameter-free drafter."""
    from specdec.batch.engine import MODEL

    on_tokens, on_round, finish = _callbacks(served, request, job)
    engine = served.engine
    draft = MODEL if engine.draft_model is not None and request.draft is served.draft else request.draft
    row = engine.add(request.prompt_ids, request.config, draft=draft, on_tokens=on_tokens, on_round=on_round)
    row.finish = finish
    return engine, row


def _failure(kind: str, payload: Any, request: GenerationRequest) -> APIError:
    if kind == "cancelled" and payload == "timeout":
        return APIError(504, f"the generation did not finish within its timeout ({request.timeout:g} s)",
                        code="timeout")
    if kind == "cancelled":
        return APIError(CLIENT_CLOSED, "the client disconnected", code="client_disconnected")
    if isinstance(payload, SpecDecError):
        return APIError(400, str(payload))
    return APIError(500, f"the generation failed: {type(payload).__name__}: {payload}", code="internal_error")


async def _next_event(job: Job, disconnected: asyncio.Future | None = None) -> tuple[str, Any]:
    """The job's next event, or ("cancelled", reason) when its deadline passes or its client leaves first."""
    get = asyncio.ensure_future(job.events.get())
    waits = {get} if disconnected is None else {get, disconnected}
    done, _ = await asyncio.wait(waits, timeout=max(0.0, job.deadline - time.monotonic()),
                                 return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    reason = "disconnected" if disconnected is not None and disconnected in done else "timeout"
    job.cancel(reason)
    return "cancelled", reason


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(load: Callable[[], Served], *, max_queue: int = 16, api_key: str | None = None,
               on_load_error: Callable[[BaseException], None] | None = None, ui: bool = True,
               max_batch: int = 1) -> Starlette:
    """The application; ``load`` runs once on the worker thread at start-up and returns what is served.
    ``ui``: serve the playground page at ``/`` (its files under ``/ui``). ``max_batch`` > 1: requests run as
    rows of one batch (``load`` gives the Served its ``engine``), up to that many at once."""
    state: dict[str, Any] = {"served": None, "error": None, "created": int(time.time())}
    worker: Worker | None = None

    def load_models() -> None:
        t0 = time.perf_counter()
        try:
            state["served"] = served = load()
        except BaseException as err:  # reported, then the server stops (the command exits with an error)
            state["error"] = err
            log.error("loading the models failed: %s", err)
            if on_load_error is not None:
                on_load_error(err)
            return
        log.info("ready in %.1f s: %s, draft %s", time.perf_counter() - t0, served.model_id, served.draft_label)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal worker
        worker = BatchWorker(max_queue, max_batch) if max_batch > 1 else Worker(max_queue)
        worker.call(load_models)
        app.state.worker = worker
        yield
        worker.stop()

    def ready(request: Request) -> Served:
        if api_key:
            header = request.headers.get("authorization", "")
            token = header[7:] if header[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                               code="invalid_api_key")
        if state["served"] is None:
            raise APIError(503, "the models are still loading; GET /health says when they are ready", code="loading")
        return state["served"]

    async def health(request: Request) -> Response:
        served = state["served"]
        if served is None:
            status = "failed" if state["error"] is not None else "loading"
            return JSONResponse({"status": status}, status_code=503)
        return JSONResponse({"status": "ready", "model": served.model_id, "draft": served.draft_label,
                             **worker.snapshot()})

    async def models(request: Request) -> Response:
        served = ready(request)
        entry = {"id": served.model_id, "object": "model", "created": state["created"], "owned_by": "specdec",
                 "specdec": {"target": served.target.name, "draft": served.draft_label,
                             "max_context": served.target.max_context, "api_key_required": bool(api_key),
                             "precision": served.target.quantization or str(served.target.dtype).replace("torch.", ""),
                             "block_invariant": served.target.block_invariant}}
        return JSONResponse({"object": "list", "data": [entry]})

    async def generate(request: Request, chat: bool) -> Response:
        served = ready(request)
        req = parse_request(parse_json(await request.body()), chat=chat, served=served)
        job = Job(run=lambda job: _run_generation(served, req, job), deadline=time.monotonic() + req.timeout,
                  start_row=lambda job: _start_row(served, req, job), finish_row=lambda row: row.finish(row.output))
        try:
            worker.submit(job)
        except QueueFull as full:
            raise APIError(429, f"the queue is full ({worker.max_queue} requests wait behind the running one); "
                                f"retry in {full.retry_after} s", code="queue_full",
                           headers={"Retry-After": str(full.retry_after)}) from None
        reply = Reply(req, served.model_id)
        if req.stream:
            return StreamingResponse(_events(job, req, reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        disconnected = asyncio.ensure_future(_disconnect(request))
        try:
            kind, payload = await _next_event(job, disconnected)
        finally:
            disconnected.cancel()
        if kind != "done":
            raise _failure(kind, payload, req)
        out, _, queued = payload
        return JSONResponse(reply.response(out, queued))

    async def _events(job: Job, req: GenerationRequest, reply: Reply) -> AsyncIterator[bytes]:
        try:
            if (first := reply.first_chunk()) is not None:
                yield sse(first)
            while True:
                kind, payload = await _next_event(job)
                if kind == "tokens":
                    yield sse(reply.chunk(payload["draft_text"] + payload["target_text"], specdec=payload))
                    continue
                if kind == "done":
                    out, tail, queued = payload
                    yield sse(reply.chunk(tail or None, finish_reason(out.stats.stop_reason),
                                          specdec=reply.statistics(out, queued)))
                    if req.include_usage:
                        yield sse(reply.usage_chunk(out))
                else:
                    yield sse(_failure(kind, payload, req).to_dict())
                yield sse("[DONE]")
                return
        finally:  # the client left (Starlette cancels this generator) or the stream ended: stop the generation
            job.cancel("disconnected")

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def api_error(request: Request, exc: APIError) -> Response:
        return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).to_dict(), status_code=exc.status_code)

    async def internal_error(request: Request, exc: Exception) -> Response:
        return JSONResponse(APIError(500, f"internal server error ({type(exc).__name__})").to_dict(), status_code=500)

    async def page(request: Request) -> Response:
        return FileResponse(UI / "index.html", headers={"Cache-Control": "no-cache"})

    playground = [Route("/", page, methods=["GET"]), Mount("/ui", StaticFiles(directory=UI), name="ui")] if ui else []
    return Starlette(
        routes=[
            *playground,
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        exception_handlers={APIError: api_error, HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )

"""The OpenAI wire format: request fields into a validated generation, results into responses and chunks.

Honoured fields: ``model``, ``prompt`` (completions: a string, one-string list or token ids) or
``messages`` (chat: the model's chat template), ``max_tokens`` (chat also ``max_completion_tokens``),
``temperature``, ``top_p``, ``stop``, ``seed``, ``n`` = 1, ``stream``, ``stream_options.include_usage``,
``response_format`` (structured output, exact under speculation; an output cut by ``max_tokens`` has
``finish_reason`` "length" and ``specdec.constraint.complete`` false), ``prediction`` (Predicted Outputs).
Extra fields: ``top_k``, ``gamma`` (constant), ``gamma_schedule`` (:data:`specdec.schedules.SCHEDULES`; with it,
``gamma`` is where it starts), ``draft`` (``"none"``: plain, or a parameter-free drafter), ``timeout`` (seconds,
at most the server's). Defaults are the library's: greedy and 128 tokens (OpenAI's: temperature 1, 16 tokens).
Fields that ask for what specdec does not do (``n`` > 1, ``best_of``, ``echo``, ``logprobs``, ``suffix``,
penalties, ``logit_bias``, tools) are refused with 400; other unknown fields are ignored, as most do.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from specdec.config import GenerationConfig
from specdec.errors import SpecDecError
from specdec.schedules import SCHEDULES

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               405: "invalid_request_error", 429: "rate_limit_error", 504: "timeout_error"}

# field: the values that mean "not asked for"
UNSUPPORTED = {
    "best_of": (None, 1), "echo": (None, False), "logprobs": (None, False), "top_logprobs": (None, 0),
    "suffix": (None, ""), "logit_bias": (None, {}), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "tools": (None, []), "functions": (None, []),
}


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        kind = ERROR_TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Served:
    """What the server serves: the loaded models and the generation options of the command line (a request's own
    gamma or gamma_schedule replaces the server's)."""

    model_id: str
    target: Any
    draft: Any
    draft_label: str
    options: dict[str, Any]  # GenerationConfig fields from the command line (gamma, gamma_schedule, max_gamma, ...)
    timeout: float
    engine: Any = None  # batched serving: the specdec.BatchEngine every request joins as a row

    @property
    def names(self) -> set[str]:
        return {self.model_id, self.target.name}


@dataclass
class GenerationRequest:
    chat: bool
    prompt_ids: list[int]
    config: GenerationConfig
    draft: Any
    draft_label: str
    stream: bool
    include_usage: bool
    timeout: float


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise APIError(400, f"the request body is not valid JSON ({err})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    where = _lone_surrogate(body)
    if where is not None:
        path, index = where
        raise APIError(400, f"{path or 'a key'} holds invalid Unicode: a lone surrogate (a \\ud800-\\udfff escape "
                            f"without its pair) at character {index}; send valid UTF-8 text", param=path or None,
                       code="invalid_unicode")
    return body


def _lone_surrogate(value: Any, path: str = "") -> tuple[str, int] | None:
    """(the field's path, the character's index) of the first string in a parsed JSON value that holds a lone
    surrogate, or None. JSON escapes such as "\\udcff" decode to one; no text encoding, so no tokenizer, takes it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return path, err.start
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _lone_surrogate(key) is not None:
            return path, 0
        found = _lone_surrogate(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def _field(body: dict, name: str, kinds: tuple[type, ...], what: str, check: Callable[[Any], bool] = lambda v: True):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds) or not check(value):
        raise APIError(400, f"'{name}' must be {what}, got {value!r}", param=name)
    return value


def _stop(body: dict) -> list[str] | None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return [stop] if stop else None
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(400, f"'stop' must be a non-empty string or a list of them, got {stop!r}", param="stop")
    return stop or None


def _completion_prompt(body: dict, target: Any) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # ["text"] or [[ids]]: one prompt
    if isinstance(prompt, str):
        if not prompt.strip():
            raise APIError(400, "'prompt' is empty; give some text to continue", param="prompt")
        return target.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < target.vocab_size]
        if bad:
            raise APIError(400, f"prompt token ids must be in [0, {target.vocab_size}), got {bad[:5]}", param="prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise APIError(400, "one prompt per request (specdec serves n = 1, no batches)", param="prompt")
    if prompt is None or prompt == []:
        raise APIError(400, "'prompt' is required and must not be empty", param="prompt")
    raise APIError(400, f"'prompt' must be a string or a list of token ids, got {prompt!r}", param="prompt")


def _message_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise APIError(400, f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content")


def _chat_prompt(body: dict, target: Any) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' is required: a non-empty list of {role, content}", param="messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
        turns.append({"role": m["role"], "content": _message_text(m.get("content"), i)})
    if not any(t["content"].strip() for t in turns):
        raise APIError(400, "the messages are empty; give some text", param="messages")
    if not getattr(target.tokenizer, "chat_template", None):
        raise APIError(400, f"{target.name} has no chat template; use /v1/completions", param="messages")
    try:
        ids = target.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    except Exception as err:  # the template refused the conversation (a role it does not know, ...)
        raise APIError(400, f"the chat template refused the messages: {err}", param="messages") from None
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # BatchEncoding in recent transformers


def _draft(body: dict, served: Served) -> tuple[Any, str]:
    """(draft for specdec.generate, its label)."""
    from specdec.drafters import DRAFTER_NAMES, DraftKind, plan_draft

    name = body.get("draft")
    if name is None or name in ("default", served.draft_label):
        return served.draft, served.draft_label
    if name == "none":
        return None, "none"
    try:  # a client may name one parameter-free drafter (a model would load in the server)
        drafter = isinstance(name, str) and plan_draft(name).kind is DraftKind.DRAFTER
    except SpecDecError:
        drafter = False
    if drafter:
        return name, name
    allowed = ", ".join(["none", "default", served.draft_label, *DRAFTER_NAMES])
    raise APIError(400, f"'draft' must be one of {allowed}; got {name!r}", param="draft")


def _response_format(body: dict) -> dict[str, Any]:
    """OpenAI's ``response_format``: {"type": "text"} (nothing), {"type": "json_object"} (any JSON object), or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (JSON satisfying ``schema``; the output
    always satisfies it, so ``strict`` changes nothing). Returns the generation's constraint options."""
    value = body.get("response_format")
    if value is None:
        return {}
    shape = ('{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., '
             '"schema": {...}}}')
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError(400, f"'response_format' must be {shape}; got {json.dumps(value)[:120]}", param="response_format")
    if value["type"] == "text":
        return {}
    if value["type"] == "json_object":
        return {"json_schema": {"type": "object"}}
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise APIError(400, f"'response_format.json_schema' must be an object with a 'schema' object: {shape}",
                       param="response_format")
    return {"json_schema": spec.get("schema", {})}


def _prediction(body: dict) -> dict[str, Any]:
    """OpenAI's Predicted Outputs, ``{"type": "content", "content": text or [{"type": "text", "text": ...}]}``, as the
    generation's prediction option (an empty content is no prediction)."""
    value, shape = body.get("prediction"), '{"type": "content", "content": "text"} (or a list of text parts)'
    if value is None:
        return {}
    content = value.get("content") if isinstance(value, dict) and value.get("type") == "content" else None
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise APIError(400, f"'prediction' must be {shape}", param="prediction")
    return {"prediction": content} if content else {}


def _config(options: dict[str, Any]) -> GenerationConfig:
    try:
        return GenerationConfig.from_options(**options)
    except SpecDecError as err:
        message = str(err)
        field = message.split(" ", 1)[0]
        param = {"max_new_tokens": "max_tokens", "max_gamma": "gamma"}.get(field, field)
        if "json_schema" in options and ("JSON schema" in message or "constraint" in message):
            param = "response_format"
        raise APIError(400, message.replace("max_new_tokens", "max_tokens"),
                       param=param if param in options or param in ("max_tokens", "response_format") else None) from None


def parse_request(body: dict[str, Any], *, chat: bool, served: Served) -> GenerationRequest:
    """Validate an OpenAI request body; raises :class:`APIError` (400) naming the field at fault."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, f"'model' is required; this server serves {served.model_id!r}", param="model")
    if model not in served.names:
        raise APIError(400, f"the model {model!r} is not served here; this server serves {served.model_id!r}",
                       param="model", code="model_not_found")
    _field(body, "n", (int,), "1 (specdec generates one completion per request)", lambda v: v == 1)
    for name, off in UNSUPPORTED.items():
        if body.get(name, None) not in off:
            raise APIError(400, f"'{name}' is not supported by specdec serve", param=name)
    stream = _field(body, "stream", (bool,), "true or false") or False
    options = _field(body, "stream_options", (dict,), "an object") or {}
    number = (int, float)
    max_tokens = _field(body, "max_tokens", (int,), "an integer >= 1", lambda v: v >= 1)
    if chat and max_tokens is None:
        max_tokens = _field(body, "max_completion_tokens", (int,), "an integer >= 1", lambda v: v >= 1)
    fields = dict(
        temperature=_field(body, "temperature", number, "a number >= 0", lambda v: math.isfinite(v) and v >= 0),
        top_p=_field(body, "top_p", number, "a number in (0, 1]", lambda v: 0 < v <= 1),
        top_k=_field(body, "top_k", (int,), "an integer >= 1", lambda v: v >= 1),
        seed=_field(body, "seed", (int,), "an integer in 64 bits (-2**63 to 2**64 - 1)", lambda v: -2**63 <= v < 2**64),
        stop=_stop(body),
        max_new_tokens=max_tokens,
    )
    gamma = _field(body, "gamma", (int,), "an integer >= 1", lambda v: v >= 1)
    schedule = _field(body, "gamma_schedule", (str,), f"one of {', '.join(SCHEDULES)}", lambda v: v in SCHEDULES)
    timeout = _field(body, "timeout", number, "a number of seconds > 0", lambda v: v > 0)
    prompt_ids = _chat_prompt(body, served.target) if chat else _completion_prompt(body, served.target)

    where = "messages" if chat else "prompt"
    context = served.target.max_context
    if context is not None and len(prompt_ids) >= context:
        raise APIError(400, f"the {where} has {len(prompt_ids)} tokens but the model reads at most {context}",
                       param=where, code="context_length_exceeded")
    if context is not None and max_tokens is not None and len(prompt_ids) + max_tokens > context:
        raise APIError(400, f"this model's context is {context} tokens; you asked for {len(prompt_ids)} in the "
                            f"{where} + {max_tokens} to generate", param="max_tokens", code="context_length_exceeded")

    draft, label = _draft(body, served)
    constraint = _response_format(body)
    if draft == "grammar" and not constraint:
        raise APIError(400, "'draft': \"grammar\" proposes the tokens a constraint forces: give a response_format "
                            "of type json_object or json_schema, or another draft", param="draft")
    asked = {name: value for name, value in (("gamma", gamma), ("gamma_schedule", schedule)) if value is not None}
    prediction = _prediction(body)
    config = _config({**served.options, **fields, **constraint, **asked, **prediction})
    if prediction:
        from specdec.decoding import prediction_ids

        try:
            prediction_ids(served.target, config)  # (checked before it runs: it must fit the context)
        except SpecDecError as err:
            raise APIError(400, str(err), param="prediction") from None
    return GenerationRequest(
        chat=chat, prompt_ids=prompt_ids, config=config, draft=draft, draft_label=label, stream=stream,
        include_usage=bool(options.get("include_usage")), timeout=min(timeout or served.timeout, served.timeout),
    )


def theorem8(stats: Any) -> dict[str, float] | None:
    """Theorem 8 for a finished generation: {alpha, gamma, c, expected_speedup}; None when nothing was drafted.

    alpha is the generation's (Corollary 6); gamma the mean drafted tokens of the rounds that drafted,
    rounded (the formula takes a whole gamma); c the measured draft time per drafted token over the target's
    time per call. The target's time is that of its verification passes, so on hardware where verifying
    gamma + 1 tokens costs more than one step (s > 0, specdec.analysis) c absorbs it and the figure is what
    this generation's costs predict, not the paper's idealization.
    """
    from specdec.analysis import walltime_improvement

    rounds = stats.drafted_per_position[0] if stats.drafted_per_position else 0
    if not rounds or stats.alpha is None or not stats.target_calls or stats.time_target <= 0:
        return None
    gamma = max(1, round(stats.drafted / rounds))
    c = (stats.time_draft / stats.drafted) / (stats.time_target / stats.target_calls)
    return {"alpha": stats.alpha, "gamma": gamma, "c": c,
            "expected_speedup": walltime_improvement(min(1.0, stats.alpha), gamma, c)}


def finish_reason(stop_reason: str) -> str:
    return "stop" if stop_reason in ("eos", "stop", "constraint") else "length"


class Reply:
    """The response objects of one request: the whole response, stream chunks, the usage chunk."""

    def __init__(self, request: GenerationRequest, model_id: str):
        self.chat = request.chat
        self.label = request.draft_label
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.head = {"id": self.id, "created": int(time.time()), "model": model_id}

    def _choice(self, text: str | None, finish: str | None, streaming: bool) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if streaming:
            return {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None,
                    "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}

    def _object(self, streaming: bool) -> str:
        if self.chat:
            return "chat.completion.chunk" if streaming else "chat.completion"
        return "text_completion"

    def usage(self, out: Any) -> dict[str, Any]:
        """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: the prompt's positions the prefix cache
        gave (specdec.batch.prefix_cache)."""
        prompt, completion = len(out.prompt_ids), len(out.token_ids)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": out.stats.cached_tokens}}
        if out.stats.prediction:  # Predicted Outputs: OpenAI's counts of the prediction's tokens
            usage["completion_tokens_details"] = {key: out.stats.prediction[key] for key in
                                                  ("accepted_prediction_tokens", "rejected_prediction_tokens")}
        return usage

    def statistics(self, out: Any, queued_s: float) -> dict[str, Any]:
        """The ``specdec`` object: the generation's statistics, its draft and gamma, its time in the queue,
        and Theorem 8's expected walltime improvement for the measured alpha and c (:func:`theorem8`)."""
        return {**out.stats.to_dict(), "draft": self.label, "gamma": out.config.gamma,
                "gamma_schedule": out.config.gamma_schedule, "queued_s": queued_s, "theory": theorem8(out.stats)}

    def response(self, out: Any, queued_s: float) -> dict[str, Any]:
        return {**self.head, "object": self._object(False),
                "choices": [self._choice(out.text, finish_reason(out.stats.stop_reason), False)],
                "usage": self.usage(out), "specdec": self.statistics(out, queued_s)}

    def first_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant's role, as OpenAI's do."""
        if not self.chat:
            return None
        chunk = self.chunk("")
        chunk["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return chunk

    def chunk(self, text: str | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**self.head, "object": self._object(True), "choices": [self._choice(text, finish, True)], **extra}

    def usage_chunk(self, out: Any) -> dict[str, Any]:
        return {**self.head, "object": self._object(True), "choices": [], "usage": self.usage(out)}


def sse(obj: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()

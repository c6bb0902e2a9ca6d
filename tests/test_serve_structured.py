"""Structured output through specdec serve: OpenAI's ``response_format`` on completions and chat completions,
streaming included, one request at a time and batched; the output equals specdec.generate's under the same
schema (greedy) and satisfies it. A real server process over tiny models with the character vocabulary."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

import specdec
from serving import tiny_server

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module", params=[1, 2], ids=["one-at-a-time", "batched"])
def server(request, tmp_path_factory):
    with tiny_server(tmp_path_factory.mktemp("serve-structured"), "--max-batch", str(request.param),
                     draft_noise=0.2, chars=True) as served:
        served.target = specdec.load(served.model, dtype="fp32")
        yield served


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_json_schema_equals_generate_and_satisfies_the_schema(server, client):
    messages = [{"role": "user", "content": "Plan a trip."}]
    ref = specdec.generate(server.target, "Plan a trip.", chat=True, json_schema=SCHEMA, max_new_tokens=80)
    out = client.chat.completions.create(model=server.model, messages=messages, max_tokens=80,
                                         response_format=JSON_SCHEMA_FORMAT)
    text = out.choices[0].message.content
    assert text == ref.text and out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)
    chunks = list(client.chat.completions.create(model=server.model, messages=messages, max_tokens=80, stream=True,
                                                 response_format=JSON_SCHEMA_FORMAT))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_json_object_at_temperature_one(server, client):
    for seed in range(3):
        out = client.completions.create(model=server.model, prompt="data=", max_tokens=120, temperature=1.0,
                                        seed=seed, extra_body={"response_format": {"type": "json_object"}})
        if out.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(out.choices[0].text), dict)
        else:  # a random model may write a long object: it ends at max_tokens, and says so
            assert out.model_extra["specdec"]["constraint"]["complete"] is False


def test_a_schema_cut_by_max_tokens_finishes_with_length_and_says_so(server, client):
    out = client.completions.create(model=server.model, prompt="x", max_tokens=4,
                                    extra_body={"response_format": JSON_SCHEMA_FORMAT})
    assert out.choices[0].finish_reason == "length"
    assert out.model_extra["specdec"]["constraint"]["complete"] is False
    assert out.model_extra["specdec"]["constraint"]["kind"] == "json_schema"


def test_an_invalid_schema_is_a_400_before_any_model_runs(server, client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "two"}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                       response_format=bad)
    assert err.value.body["param"] == "response_format"
    assert "the JSON schema is invalid" in err.value.body["message"]

"""The playground page of `specdec serve`, in a real browser: Playwright driving the system's Chromium
(Debian's package; `make test` installs it) against a served tiny model. Without Playwright or Chromium
the tests skip and say why."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

import specdec
from serving import tiny_server

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install -e '.[test]'")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no Chromium on this machine (`make test` installs Debian's chromium with apt-get where it can, "
                "as root)", allow_module_level=True)

# A closed network: without these Chromium keeps trying to reach Google's hosts.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PROMPT = "w5 w6 w7"
N = 24
WAIT_MS = 60_000
DRAFT_GREEN, TARGET_BLUE = "rgb(26, 127, 55)", "rgb(5, 80, 174)"  # style.css: --draft, --target
PREDICTION_PURPLE = "rgb(130, 80, 223)"  # style.css: --prediction


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # a draft close to the target: rounds with accepted, rejected and target tokens alike
    with tiny_server(tmp_path_factory.mktemp("playground"), draft_noise=0.3) as served:
        yield served


@pytest.fixture(scope="module")
def reference(server):
    """The target's own greedy decoding of PROMPT."""
    return specdec.generate(specdec.load(server.model, dtype="fp32"), PROMPT, max_new_tokens=N).text


@pytest.fixture()
def page(browser, server):
    page = browser.new_page()
    page.goto(server.url + "/")
    page.wait_for_function("document.body.dataset.state === 'ready'", timeout=WAIT_MS)
    yield page
    page.close()


def _settings(page, **values):
    for name, value in values.items():
        page.fill(f"#{name}", str(value))


def _segments(page, selector: str = "#output") -> list[tuple[str, str]]:
    """The output's pieces in order: (class, text)."""
    pieces = page.eval_on_selector_all(f"{selector} > *", "nodes => nodes.map(n => [n.className, n.textContent])")
    return [tuple(p) for p in pieces]


def _stream_chunks(server, **body) -> list[dict]:
    """The same request straight from the API: the specdec extension of each streamed chunk."""
    request = {"model": server.model, "prompt": PROMPT, "max_tokens": N, "stream": True, **body}
    with httpx.stream("POST", server.url + "/v1/completions", json=request, timeout=60) as answer:
        events = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
    return [json.loads(e)["specdec"] for e in events if e != "[DONE]"]


def test_the_page_loads_with_the_served_models(page, server):
    assert page.title() == "specdec playground"
    assert page.text_content("#model") == server.model
    served = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["specdec"]
    assert page.text_content("#served-draft") == served["draft"] and served["draft"].endswith("draft+int8")
    assert (served["precision"], served["block_invariant"]) == ("float32", False)
    assert page.locator("#key-box").is_hidden() and page.locator("#error").is_hidden()


def test_a_generation_streams_with_its_origins_and_statistics(page, server, reference):
    _settings(page, prompt=PROMPT, **{"max-tokens": N, "gamma": 3})
    page.click("#generate")
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=WAIT_MS)
    segments = _segments(page)
    # the visible text (struck-through rejected drafts aside) is the target's own greedy decoding
    assert "".join(text for kind, text in segments if kind != "rejected") == reference
    # the colours follow the stream's origins, target call by target call
    rounds = [c for c in _stream_chunks(server, gamma=3) if "draft_text" in c]
    expected = [(kind, c[f"{kind}_text"]) for c in rounds for kind in ("draft", "rejected", "target") if c[f"{kind}_text"]]
    assert segments == expected
    assert {"draft", "rejected", "target"} <= {kind for kind, _ in segments}
    style = "([s, p]) => getComputedStyle(document.querySelector(s))[p]"
    assert page.evaluate(style, ["#output .draft", "color"]) == DRAFT_GREEN
    assert page.evaluate(style, ["#output .target", "color"]) == TARGET_BLUE
    assert "line-through" in page.evaluate(style, ["#output del.rejected", "textDecorationLine"])
    # the statistics: target calls, tokens per call and acceptance as the stream reported them
    final = _stream_chunks(server, gamma=3)[-1]
    assert page.text_content("#stat-calls") == str(final["target_calls"]) == str(len(rounds))
    assert page.text_content("#stat-acc") == f"{final['accepted']} / {final['drafted']}"
    assert page.text_content("#stat-mal") == f"{N / len(rounds):.2f}"
    assert page.text_content("#stat-alpha") == f"{final['alpha']:.3f}"
    assert page.text_content("#stat-expected").endswith("(gamma 3)")
    assert float(page.text_content("#stat-tps")) > 0
    bars = page.eval_on_selector_all("#chart rect", "rects => rects.map(r => r.getAttribute('class'))")
    assert bars.count("bar-target") == len(rounds) and bars.count("bar-draft") == sum(c["from_draft"] > 0 for c in rounds)
    # hiding the rejected drafts hides them, and only them
    page.uncheck("#show-rejected")
    assert page.locator("#output del.rejected").first.is_hidden() and page.locator("#output .draft").first.is_visible()


def test_a_prediction_from_the_page_drafts_and_its_tokens_are_coloured(page, server, reference):
    """The prediction box sends OpenAI's prediction: the text is the target's own, and the tokens accepted from the
    prediction have their colour, round by round as the stream says."""
    _settings(page, prompt=PROMPT, prediction=reference, **{"max-tokens": N})
    page.click("#generate")
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=WAIT_MS)
    segments = _segments(page)
    assert "".join(text for kind, text in segments if kind != "rejected") == reference
    rounds = [c for c in _stream_chunks(server, prediction={"type": "content", "content": reference})
              if "draft_text" in c]
    expected = [("prediction" if kind == "draft" and c["from_prediction"] else kind, c[f"{kind}_text"])
                for c in rounds for kind in ("draft", "rejected", "target") if c[f"{kind}_text"]]
    assert segments == expected
    predicted = "".join(text for kind, text in segments if kind == "prediction")
    assert len(predicted) > len(reference) / 2  # most of the text came from the prediction
    style = "([s, p]) => getComputedStyle(document.querySelector(s))[p]"
    assert page.evaluate(style, ["#output .prediction", "color"]) == PREDICTION_PURPLE


def test_a_race_shows_identical_texts_and_both_speeds(page, reference):
    _settings(page, prompt=PROMPT, **{"max-tokens": N})
    page.click("#race")
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=WAIT_MS)
    plain = "".join(text for kind, text in _segments(page, "#output-plain") if kind != "rejected")
    spec = "".join(text for kind, text in _segments(page) if kind != "rejected")
    assert plain == spec == reference
    assert {kind for kind, _ in _segments(page, "#output-plain")} == {"target"}  # plain: every token the target's
    assert page.text_content("#race-verdict") == "The two texts are identical."
    assert page.text_content("#speed-plain").endswith("tokens/s") and page.text_content("#speed-spec").endswith("tokens/s")
    assert page.text_content("#stat-measured").endswith("x")


def test_a_bad_setting_shows_the_servers_message(page):
    _settings(page, temperature=-1)
    page.click("#generate")
    page.wait_for_function("document.body.dataset.state === 'error'", timeout=WAIT_MS)
    assert page.text_content("#error") == "'temperature' must be a number >= 0, got -1"
    assert page.text_content("#output") == ""


def test_plain_decoding_from_the_page_has_no_draft_tokens(page):
    _settings(page, prompt=PROMPT, **{"max-tokens": 8})
    page.select_option("#draft", "none")
    page.click("#generate")
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=WAIT_MS)
    assert {kind for kind, _ in _segments(page)} == {"target"} and page.text_content("#stat-calls") == "8"
    assert page.text_content("#stat-expected") == "–"  # nothing drafted: no Theorem 8 figure


def test_the_api_key(browser, tmp_path_factory):
    with tiny_server(tmp_path_factory.mktemp("keyed"), "--api-key", "sesame") as server:
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_function("document.body.dataset.state === 'needs-key'", timeout=WAIT_MS)
        unauthorized = "invalid or missing API key: send the header 'Authorization: Bearer <key>'"
        assert page.locator("#key-box").is_visible() and page.text_content("#error") == unauthorized
        page.fill("#api-key", "wrong")
        page.click("#key-save")
        page.wait_for_function("document.body.dataset.state === 'needs-key'", timeout=WAIT_MS)
        assert page.text_content("#error") == unauthorized and page.text_content("#model") == "…"
        page.fill("#api-key", "sesame")
        page.click("#key-save")
        page.wait_for_function("document.body.dataset.state === 'ready'", timeout=WAIT_MS)
        assert page.text_content("#model") == server.model and page.locator("#error").is_hidden()
        _settings(page, prompt=PROMPT, **{"max-tokens": 6})
        page.click("#generate")
        page.wait_for_function("document.body.dataset.state === 'done'", timeout=WAIT_MS)
        assert len(page.text_content("#output").split()) >= 6
        page.close()


def test_a_json_schema_from_the_page_gives_json_that_satisfies_it(browser, tmp_path_factory):
    """The schema box sends response_format: the output parses and satisfies the schema, and is what
    specdec.generate gives under the same schema; a box that is not JSON says so before any request."""
    import jsonschema

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1,
                                                                                "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    with tiny_server(tmp_path_factory.mktemp("schema"), draft_noise=0.3, chars=True) as server:
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_function("document.body.dataset.state === 'ready'", timeout=WAIT_MS)
        _settings(page, prompt="state:", schema="{not json", **{"max-tokens": 40})
        page.click("#generate")
        page.wait_for_function("document.body.dataset.state === 'error'", timeout=WAIT_MS)
        assert page.text_content("#error").startswith("the JSON schema box does not hold valid JSON")
        _settings(page, schema=json.dumps(schema))
        page.click("#generate")
        page.wait_for_function("document.body.dataset.state === 'done'", timeout=WAIT_MS)
        text = "".join(piece for kind, piece in _segments(page) if kind != "rejected")
        jsonschema.validate(json.loads(text), schema)
        ref = specdec.generate(specdec.load(server.model, dtype="fp32"), "state:", json_schema=schema, max_new_tokens=40)
        assert text == ref.text
        page.close()

// The specdec playground: streams a generation from this server's OpenAI endpoint and shows, per target
// call, the draft tokens the target accepted, the ones it rejected and the token it produced itself
// (the stream's "specdec" extension fields: draft_text, rejected_text, target_text, tokens, from_draft,
// drafted, from_prediction: the draft came from the request's prediction; the last chunk carries the generation's
// statistics and Theorem 8's figure).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, key: sessionStorage.getItem("specdec-api-key") || "", controller: null };

function setStatus(status) { document.body.dataset.state = status; }

function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || `${response.status} ${response.statusText}`;
  } catch (_) {
    return `${response.status} ${response.statusText}`;
  }
}

async function loadModel() {
  let response;
  try {
    response = await fetch("/v1/models", { headers: headers() });
  } catch (err) {
    showError("the server cannot be reached: " + err.message);
    return;
  }
  if (response.status === 401) {
    $("key-box").hidden = false;
    showError(await errorMessage(response));
    setStatus("needs-key");
    return;
  }
  if (response.status === 503) {  // still loading the models
    showError(await errorMessage(response));
    setTimeout(loadModel, 2000);
    return;
  }
  if (!response.ok) {
    showError(await errorMessage(response));
    return;
  }
  const entry = (await response.json()).data[0];
  state.model = entry.id;
  state.target = entry.specdec;
  $("model").textContent = entry.specdec.target;
  $("served-draft").textContent = entry.specdec.draft;
  $("draft").options[0].textContent = "served: " + entry.specdec.draft;
  showError("");
  setStatus("ready");
}

// A number field: omitted when empty, the number when it parses, else the raw text (the server names the error).
function field(id, integer) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  const value = integer ? Number.parseInt(raw, 10) : Number.parseFloat(raw);
  return Number.isNaN(value) || String(value) !== String(Number(raw)) ? raw : value;
}

function requestBody(draft) {
  const body = { model: state.model || "", stream: true, draft };
  const options = { temperature: field("temperature"), top_p: field("top-p"), top_k: field("top-k", true),
                    max_tokens: field("max-tokens", true), seed: field("seed", true), gamma: field("gamma", true) };
  for (const [name, value] of Object.entries(options)) if (value !== undefined) body[name] = value;
  if ($("schedule").value) body.gamma_schedule = $("schedule").value;
  const schema = $("schema").value.trim();
  if (schema) {  // structured output: OpenAI's response_format, exact under speculation
    let parsed;
    try {
      parsed = JSON.parse(schema);
    } catch (err) {
      throw new Error(`the JSON schema box does not hold valid JSON (${err.message}); fix it or empty it`);
    }
    body.response_format = { type: "json_schema", json_schema: { name: "playground", schema: parsed } };
  }
  const prediction = $("prediction").value;
  if (prediction) body.prediction = { type: "content", content: prediction };  // OpenAI's Predicted Outputs
  const prompt = $("prompt").value;
  if ($("chat").checked) body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  return body;
}

function append(output, text, kind) {
  if (!text) return;
  const node = document.createElement(kind === "rejected" ? "del" : "span");
  node.className = kind;
  node.textContent = text;
  output.appendChild(node);
}

// One streamed generation into `output`; `onRound(rounds)` after each target call. Returns
// {text, stats, seconds} (stats: the final chunk's specdec object).
async function stream(draft, output, onRound) {
  state.controller = new AbortController();
  const chat = $("chat").checked;
  const started = performance.now();
  const response = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
    method: "POST", headers: headers(), body: JSON.stringify(requestBody(draft)), signal: state.controller.signal });
  if (!response.ok) throw new Error(await errorMessage(response));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const rounds = [];
  let buffer = "", text = "", stats = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const chunk = JSON.parse(event.slice(6));
      if (chunk.error) throw new Error(chunk.error.message);
      const extra = chunk.specdec;
      if (!extra) continue;  // the chat stream's first chunk (the role), or the usage chunk
      if ("draft_text" in extra) {  // one target call
        append(output, extra.draft_text, extra.from_prediction ? "prediction" : "draft");
        append(output, extra.rejected_text, "rejected");
        append(output, extra.target_text, "target");
        text += extra.draft_text + extra.target_text;
        rounds.push({ tokens: extra.tokens, fromDraft: extra.from_draft, drafted: extra.drafted });
        onRound(rounds, (performance.now() - started) / 1000);
      } else {  // the last chunk: text held back for stop strings, and the statistics
        const choice = chunk.choices[0] || {};
        const tail = chat ? (choice.delta || {}).content : choice.text;
        append(output, tail, "target");
        text += tail || "";
        stats = extra;
      }
    }
  }
  return { text, stats, rounds, seconds: (performance.now() - started) / 1000 };
}

const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));

function showLive(rounds, seconds) {
  const tokens = rounds.reduce((s, r) => s + r.tokens, 0);
  const accepted = rounds.reduce((s, r) => s + r.fromDraft, 0);
  const drafted = rounds.reduce((s, r) => s + r.drafted, 0);
  $("stat-tps").textContent = fmt(tokens / seconds, 1);
  $("stat-calls").textContent = rounds.length;
  $("stat-mal").textContent = fmt(tokens / rounds.length);
  $("stat-acc").textContent = drafted ? `${accepted} / ${drafted}` : "–";
  drawChart(rounds);
}

function showFinal(stats) {
  if (!stats) return;
  $("stat-tps").textContent = fmt(stats.tokens_per_second, 1);
  $("stat-calls").textContent = stats.target_calls;
  $("stat-mal").textContent = fmt(stats.mean_accepted_length);
  $("stat-acc").textContent = stats.drafted ? `${stats.accepted} / ${stats.drafted}` : "–";
  $("stat-alpha").textContent = fmt(stats.alpha, 3);
  const theory = stats.theory;
  $("stat-c").textContent = theory ? fmt(theory.c, 3) : "–";
  $("stat-expected").textContent = theory ? `${fmt(theory.expected_speedup)}x (gamma ${theory.gamma})` : "–";
}

function drawChart(rounds) {
  const svg = $("chart");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const width = 600, height = 120;
  const top = Math.max(2, ...rounds.map((r) => r.drafted + 1));
  const slot = width / Math.max(40, rounds.length);
  rounds.forEach((r, i) => {
    const parts = [["bar-draft", r.fromDraft, 0], ["bar-target", r.tokens - r.fromDraft, r.fromDraft]];
    for (const [cls, n, below] of parts) {
      if (n <= 0) continue;
      const rect = document.createElementNS(ns, "rect");
      rect.setAttribute("class", cls);
      rect.setAttribute("x", i * slot + 0.5);
      rect.setAttribute("width", Math.max(1, slot - 1));
      rect.setAttribute("y", height - ((below + n) / top) * height);
      rect.setAttribute("height", (n / top) * height);
      svg.appendChild(rect);
    }
  });
}

function reset() {
  showError("");
  for (const id of ["output", "output-plain"]) $(id).replaceChildren();
  for (const id of ["stat-tps", "stat-calls", "stat-mal", "stat-acc", "stat-alpha", "stat-c", "stat-expected"]) $(id).textContent = "–";
  $("stat-measured").textContent = "race to measure";
  $("speed-plain").textContent = $("speed-spec").textContent = "";
  $("race-verdict").hidden = true;
  $("chart").replaceChildren();
}

function running() {
  $("generate").disabled = $("race").disabled = true;
  $("stop").disabled = false;
  setStatus("running");
}

// A failed run: the server's message (an aborted one, by Stop, is not a failure).
function failed(err) {
  if (err.name === "AbortError") return;
  showError(err.message);
  setStatus("error");
}

function idle() {
  if (document.body.dataset.state === "running") setStatus("done");
  $("generate").disabled = $("race").disabled = false;
  $("stop").disabled = true;
}

function speed(result) {
  const tps = result.stats ? result.stats.tokens_per_second : null;
  return tps ? `${fmt(tps, 1)} tokens/s` : "";
}

async function generate() {
  reset();
  $("pane-plain").hidden = true;
  $("spec-title").textContent = $("draft").value === "none" ? "plain decoding" : "speculative decoding";
  running();
  try {
    const result = await stream($("draft").value, $("output"), showLive);
    showFinal(result.stats);
    $("speed-spec").textContent = speed(result);
  } catch (err) {
    failed(err);
  } finally {
    idle();
  }
}

// Greedy texts that differ: why, for this target.
function raceExplanation(target) {
  if (target && !target.block_invariant && target.precision !== "float32") {
    return `The two texts differ: in ${target.precision} a pass over several tokens rounds differently from a ` +
      "one-token step, so a near-tie between two tokens can go either way. Serve the target with --quantize int8 " +
      "(block-invariant: bit for bit) or --dtype fp32 for identical texts.";
  }
  return "The two texts differ.";
}

async function race() {
  reset();
  $("pane-plain").hidden = false;
  $("spec-title").textContent = "speculative decoding";
  const draft = $("draft").value === "none" ? "default" : $("draft").value;
  running();
  try {
    const plain = await stream("none", $("output-plain"), () => {});
    $("speed-plain").textContent = speed(plain);
    const spec = await stream(draft, $("output"), showLive);
    $("speed-spec").textContent = speed(spec);
    showFinal(spec.stats);
    if (plain.stats && spec.stats) {
      $("stat-measured").textContent = `${fmt(spec.stats.tokens_per_second / plain.stats.tokens_per_second)}x`;
    }
    const verdict = $("race-verdict");
    const greedy = (field("temperature") || 0) === 0;
    verdict.hidden = false;
    verdict.className = plain.text === spec.text ? "same" : "differ";
    verdict.textContent = plain.text === spec.text ? "The two texts are identical."
      : !greedy ? "The texts differ: at temperature > 0 they are two samples of the same distribution."
      : raceExplanation(state.target);
  } catch (err) {
    failed(err);
  } finally {
    idle();
  }
}

$("form").addEventListener("submit", (e) => { e.preventDefault(); generate(); });
$("race").addEventListener("click", race);
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("show-rejected").addEventListener("change", (e) => $("panes").classList.toggle("hide-rejected", !e.target.checked));
$("key-save").addEventListener("click", () => {
  state.key = $("api-key").value;
  sessionStorage.setItem("specdec-api-key", state.key);
  loadModel();
});
if (state.key) $("api-key").value = state.key;
loadModel();

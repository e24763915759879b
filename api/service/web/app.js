// The hydraplan web page: plain JavaScript over the service's own /v1 endpoints, nothing else.
// Every value is validated by the server; a problem+json answer is shown next to the field it names.
"use strict";

const ROOT = document.querySelector("meta[name=hydraplan-root]").content;
const $ = (selector) => document.querySelector(selector);

// Where a problem's `loc` (after "body" / "query") points on this page.
const FIELD_OF = {
  lengths: "lengths", num_gpus: "num_gpus", gpus_per_node: "gpus_per_node", model: "model", gpu: "gpu",
  time_limit_s: "time_limit_s", seed: "seed", baselines: "baselines", baseline: "baselines",
  num_tokens: "num_tokens", name: "dataset", dataset: "dataset",
};
const LABELS = {
  lengths: "Sequence lengths", num_gpus: "GPUs", gpus_per_node: "GPUs per node", model: "Model", gpu: "GPU",
  time_limit_s: "Time budget", seed: "Seed", baselines: "Baselines", num_tokens: "Tokens to sample",
  dataset: "Dataset", token: "API token", request: "Request",
};

class ProblemError extends Error {
  constructor(status, problem) {
    super(problem.detail || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function token() {
  return $("#token").value.trim();
}

async function call(method, path, body) {
  const headers = {};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(ROOT + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) {
    let problem;
    try { problem = JSON.parse(text); } catch { problem = { detail: text || response.statusText }; }
    throw new ProblemError(response.status, problem);
  }
  return { text, type: response.headers.get("content-type") || "", timing: response.headers.get("server-timing") };
}

async function getJson(path) {
  return JSON.parse((await call("GET", path)).text);
}

async function postJson(path, body) {
  const answer = await call("POST", path, body);
  return { data: answer.type.includes("json") ? JSON.parse(answer.text) : null, text: answer.text, timing: answer.timing };
}

// Seconds inside the planner, from `Server-Timing: solve;dur=<ms>` (plans carry no wall time).
function solveSeconds(timing) {
  const match = /solve;dur=([0-9.]+)/.exec(timing || "");
  return match ? Number(match[1]) / 1e3 : null;
}

// ------------------------------------------------------------------------------------------
// Errors next to their fields
// ------------------------------------------------------------------------------------------

function clearErrors() {
  for (const node of document.querySelectorAll(".field-error")) node.textContent = "";
  for (const node of document.querySelectorAll(".invalid")) node.classList.remove("invalid");
}

function showError(field, message) {
  const slot = document.querySelector(`.field-error[data-field="${field}"]`) || $("#request-error");
  const line = document.createElement("span");
  line.textContent = message;
  slot.appendChild(line);
  const input = slot.parentElement.querySelector("input, textarea, select");
  if (input && slot !== $("#request-error")) input.classList.add("invalid");
}

// The page field a problem entry names, from its loc or, failing that, the field its detail starts with.
function fieldOf(loc, detail) {
  const parts = (loc || []).filter((part) => part !== "body" && part !== "query" && part !== "path");
  for (const part of parts) if (FIELD_OF[part]) return FIELD_OF[part];
  const leading = /^([a-z_]+)/.exec(detail || "");
  if (leading && FIELD_OF[leading[1]]) return FIELD_OF[leading[1]];
  return /\bsequence/.test(detail || "") ? "lengths" : "request";  // e.g. oversize sequences
}

// "entry 4: Input should be greater than 0" for ["body", "lengths", 3] (entries counted from 1).
function plainWords(loc, message) {
  const index = (loc || []).find((part) => typeof part === "number");
  return index === undefined ? message : `entry ${index + 1}: ${message}`;
}

function showProblem(error) {
  if (!(error instanceof ProblemError)) {
    showError("request", `The request failed: ${error.message}`);
    return;
  }
  const problem = error.problem;
  if (error.status === 401) {
    showError("token", `${problem.detail}. This server needs its API token.`);
    return;
  }
  if (error.status === 503) {
    showError("request", `The server is busy (${problem.detail}); try again in a moment.`);
    return;
  }
  const entries = problem.errors && problem.errors.length ? problem.errors : [{ loc: [], msg: problem.detail }];
  for (const entry of entries) {
    const field = fieldOf(entry.loc, entry.msg);
    showError(field, `${LABELS[field]}: ${plainWords(entry.loc, entry.msg)}`);
  }
}

// ------------------------------------------------------------------------------------------
// The form
// ------------------------------------------------------------------------------------------

// Lengths as typed: numbers become integers, anything else is sent as it is for the server to refuse.
function typedLengths() {
  const text = $("#lengths").value.trim();
  if (text.startsWith("[")) {
    try { return JSON.parse(text); } catch { return [text]; }
  }
  return text.split(/\s+/).filter((word) => word !== "").map((word) => (/^[+-]?\d+$/.test(word) ? Number(word) : word));
}

function typedNumber(selector) {
  const text = $(selector).value.trim();
  return text !== "" && !Number.isNaN(Number(text)) ? Number(text) : text;
}

async function batchLengths() {
  if (document.querySelector("input[name=source]:checked").value === "paste") return typedLengths();
  const query = new URLSearchParams({ num_tokens: $("#num-tokens").value.trim(), seed: $("#seed").value.trim() });
  const sample = await getJson(`/v1/datasets/${encodeURIComponent($("#dataset").value)}/sample?${query}`);
  return sample.lengths;
}

function requestBody(lengths) {
  return {
    lengths,
    num_gpus: typedNumber("#num-gpus"),
    gpus_per_node: typedNumber("#gpus-per-node"),
    model: $("#model").value,
    gpu: $("#gpu").value,
    options: { time_limit_s: typedNumber("#time-limit"), seed: typedNumber("#seed") },
  };
}

function chosenBaselines() {
  return [...document.querySelectorAll("input[name=baseline]:checked")].map((box) => box.value);
}

async function submit(event) {
  event.preventDefault();
  clearErrors();
  $("#result").hidden = true;
  sessionStorage.setItem("hydraplan-token", token());
  $("#submit").disabled = true;
  $("#status").textContent = "planning ...";
  try {
    const body = requestBody(await batchLengths());
    const baselines = chosenBaselines();
    const answer = await postJson("/v1/plans", { ...body, baselines });
    $("#status").textContent = "drawing the timeline ...";
    const compared = await baselinePlans(body, answer.data.baselines || []);
    const timeline = await postJson("/v1/plans/timeline", { plan: answer.data, compare: compared });
    const seconds = solveSeconds(answer.timing);
    showPlan(answer.data, answer.text, timeline.text, seconds);
    $("#status").textContent = seconds === null ? "planned" : `planned in ${seconds.toFixed(2)} s`;
  } catch (error) {
    $("#status").textContent = "";
    showProblem(error);
  } finally {
    $("#submit").disabled = false;
  }
}

// The baselines' own plans (POST /v1/estimate with `baseline`), for their timelines.
async function baselinePlans(body, results) {
  const planned = results.filter((result) => !result.error);
  const answers = await Promise.all(
    planned.map((result) => postJson("/v1/estimate", { ...body, baseline: result.name })),
  );
  return answers.map((answer, index) => ({ label: planned[index].name, plan: answer.data.plan }));
}

// ------------------------------------------------------------------------------------------
// The result
// ------------------------------------------------------------------------------------------

function solverFact(solver, seconds) {
  const time = seconds === null ? "" : ` in ${seconds.toFixed(2)} s`;
  const clock = solver.cut_by_clock ? " (cut by the time limit: the same request may give another plan)" : "";
  return `${solver.backend}${time}, ${solver.num_strategies_solved} strategies solved, seed ${solver.seed}${clock}`;
}

function ms(seconds) {
  const milliseconds = seconds * 1e3;
  return Math.abs(milliseconds) >= 10 ? `${milliseconds.toFixed(1)} ms` : `${milliseconds.toPrecision(3)} ms`;
}

function cells(row, values) {
  for (const value of values) {
    const cell = document.createElement("td");
    cell.textContent = value;
    row.appendChild(cell);
  }
}

// The bound and the gap; a baseline's plan (solver backend `baseline:NAME`) carries the baseline's
// own bound, over the schemes it chose, and says so (planner/render.py words it the same).
function boundFact(plan) {
  const gap = `gap ${(plan.gap * 100).toFixed(2)}%`;
  const backend = plan.solver.backend;
  if (!backend.startsWith("baseline:")) return `${ms(plan.lower_bound_s)} (${gap})`;
  return `${ms(plan.lower_bound_s)} (${backend.slice("baseline:".length)}'s own, over the schemes it chose; ${gap})`;
}

function showPlan(plan, text, svgText, seconds) {
  $("#result").hidden = false;
  $("#plan-id").textContent = plan.plan_id;
  const slowest = Math.max(...plan.pipelines.map((pipeline) => pipeline.time_s));
  const facts = [
    ["strategy", plan.strategy],
    ["status", plan.status],
    ["step time", `${ms(plan.step_time_s)} (slowest pipeline ${ms(slowest)} + grad sync ${ms(plan.grad_sync_s)})`],
    ["lower bound", boundFact(plan)],
    ["cluster", `${plan.num_gpus} GPUs, ${plan.gpus_per_node} per node`],
    ["sequences", `${plan.input_lengths.length} (${plan.input_lengths.reduce((a, b) => a + b, 0)} tokens)`],
    ["solver", solverFact(plan.solver, seconds)],
  ];
  const summary = $("#summary");
  summary.replaceChildren();
  for (const [name, value] of facts) {
    const term = document.createElement("dt");
    term.textContent = name;
    const description = document.createElement("dd");
    description.textContent = value;
    description.dataset.fact = name;
    summary.append(term, description);
  }
  const download = $("#download");
  if (download.href.startsWith("blob:")) URL.revokeObjectURL(download.href);
  download.href = URL.createObjectURL(new Blob([text], { type: "application/json" }));
  download.download = `${plan.plan_id}.json`;
  showTimeline(svgText);
  showBaselines(plan.baselines || []);
  showPipelines(plan.pipelines);
}

function showTimeline(svgText) {
  const parsed = new DOMParser().parseFromString(svgText, "image/svg+xml");
  const container = $("#timeline");
  container.replaceChildren(document.importNode(parsed.documentElement, true));
}

function showBaselines(baselines) {
  const body = $("#baselines-table tbody");
  body.replaceChildren();
  for (const baseline of baselines) {
    const row = body.insertRow();
    row.dataset.baseline = baseline.name;
    if (baseline.error) cells(row, [baseline.name, `could not plan: ${baseline.error}`, "-", "-"]);
    else cells(row, [baseline.name, baseline.strategy, ms(baseline.step_time_s), `${baseline.speedup.toFixed(2)}x`]);
  }
  if (!baselines.length) cells(body.insertRow(), ["(none chosen)", "", "", ""]);
}

function showPipelines(pipelines) {
  const body = $("#pipelines-table tbody");
  body.replaceChildren();
  for (const pipeline of pipelines) {
    const scheme = `<${pipeline.scheme.tp},${pipeline.scheme.pp},${pipeline.scheme.cp}>`;
    const largest = Math.max(...pipeline.micro_batches.map((batch) => batch.num_tokens));
    cells(body.insertRow(), [
      String(pipeline.index), scheme, String(pipeline.ranks.length), String(pipeline.num_sequences),
      String(pipeline.num_tokens), String(pipeline.micro_batches.length),
      `${largest} / ${pipeline.capacity_tokens}`, ms(pipeline.time_s),
    ]);
  }
}

// ------------------------------------------------------------------------------------------
// Start: catalogs and datasets from the service
// ------------------------------------------------------------------------------------------

// The options of a select; what the user had chosen stays chosen (the catalogs reload when the token changes).
function fill(select, names, preferred) {
  const chosen = names.includes(select.value) ? select.value : preferred;
  select.replaceChildren(...names.map((name) => new Option(name, name, false, name === chosen)));
}

async function loadCatalogs() {
  clearErrors();
  $("#status").textContent = "loading the catalogs ...";
  try {
    const [models, gpus, datasets] = await Promise.all([
      getJson("/v1/models"), getJson("/v1/gpus"), getJson("/v1/datasets"),
    ]);
    fill($("#model"), models.models.map((model) => model.name), "tiny");
    fill($("#gpu"), gpus.gpus.map((gpu) => gpu.name), "h100-sxm-80gb");
    fill($("#dataset"), datasets.datasets.map((dataset) => dataset.name), "wikipedia");
    $("#status").textContent = "ready";
  } catch (error) {
    $("#status").textContent = "";
    showProblem(error);
  }
}

function readUpload() {
  const file = $("#lengths-file").files[0];
  if (!file) return;
  file.text().then((text) => { $("#lengths").value = text; });
}

function switchSource() {
  const dataset = document.querySelector("input[name=source]:checked").value === "dataset";
  $("#paste-fields").hidden = dataset;
  $("#dataset-fields").hidden = !dataset;
}

$("#token").value = sessionStorage.getItem("hydraplan-token") || "";
$("#plan-form").addEventListener("submit", submit);
$("#lengths-file").addEventListener("change", readUpload);
$("#token").addEventListener("change", loadCatalogs);
for (const radio of document.querySelectorAll("input[name=source]")) radio.addEventListener("change", switchSource);
loadCatalogs();

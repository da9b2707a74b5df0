// Summaries (#/summaries): what the VLM wrote about a window of captions (requested here or through POST
// /v1/summaries) and the scheduled digests, newest first. Citations (c123) link to their captions; only ids the
// server kept (those in the window) become links, the rest stays text. A key with the write scope can ask for one.

import { apiJson, canWrite } from "./api.js";
import { badge, h, setStatus, timeEl } from "./ui.js";

const $ = (id) => document.getElementById(id);
const LIMIT = 50;
const CITATION = /\bc(\d{1,18})\b/g;

let loading = null;

function status(text, kind = "") {
  setStatus($("summaries-status"), text, kind);
}

// The summary's text with each kept citation as a link to its caption.
function cited(text, citations) {
  const kept = new Set(citations.map(String));
  const parts = [];
  let last = 0;
  for (const match of text.matchAll(CITATION)) {
    if (!kept.has(match[1])) continue;
    parts.push(text.slice(last, match.index));
    parts.push(h("a", { href: `#/captions/${match[1]}`, class: "cite", dataset: { caption: match[1] } }, match[0]));
    last = match.index + match[0].length;
  }
  parts.push(text.slice(last));
  return parts;
}

function summaryItem(summary) {
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  return h("li", { class: "summary-item", dataset: { id: summary.id } },
    h("div", { class: "summary-head" },
      badge(summary.kind), " ", h("span", { class: "summary-cameras" }, summary.cameras.join(", ")), " · ",
      timeEl(summary.window_start), " – ", timeEl(summary.window_end)),
    h("p", { class: "summary-text" }, cited(summary.text, summary.citations)),
    h("p", { class: "muted small" },
      `${plural(summary.caption_count, "caption")} read, ${plural(summary.citations.length, "citation")}, `,
      `${plural(summary.depth, "level")}, ${plural(summary.requests, "VLM request")}`));
}

async function loadCameras() {
  const cameras = (await apiJson("/v1/cameras")).items.map((camera) => camera.camera);
  const select = $("summaries-camera");
  const chosen = select.value;
  select.replaceChildren(new Option("any camera", ""), ...cameras.map((camera) => new Option(camera, camera)));
  select.value = cameras.includes(chosen) ? chosen : "";
  // What the form had chosen stays chosen (the view loads again when the key changes).
  const picked = new Set([...$("summary-cameras").selectedOptions].map((option) => option.value));
  $("summary-cameras").replaceChildren(...cameras.map((camera) => new Option(camera, camera, false, picked.has(camera))));
}

async function loadSummaries() {
  const controller = new AbortController();
  if (loading) loading.abort();
  loading = controller;
  const params = [["limit", String(LIMIT)]];
  if ($("summaries-camera").value) params.push(["camera", $("summaries-camera").value]);
  try {
    const page = await apiJson("/v1/summaries", { params, signal: controller.signal });
    $("summary-list").replaceChildren(...page.summaries.map(summaryItem));
    const count = page.summaries.length;
    status(count ? `${count} summar${count === 1 ? "y" : "ies"} shown` : "No summaries yet (with this filter).");
  } catch (error) {
    if (error.name === "AbortError") return;
    status(error.message, "error");
  }
}

// <input type=datetime-local> holds local time without a zone; the API takes ISO times with one.
function isoOf(local) {
  const at = new Date(local);
  return Number.isNaN(at.getTime()) ? null : at.toISOString();
}

async function requestSummary(event) {
  event.preventDefault();
  const cameras = [...$("summary-cameras").selectedOptions].map((option) => option.value);
  const start = isoOf($("summary-start").value);
  const end = isoOf($("summary-end").value);
  if (!cameras.length || !start || !end) {
    status("Choose at least one camera, a start and an end.", "error");
    return;
  }
  const button = $("summary-submit");
  button.disabled = true;
  status("The VLM is writing the summary...");
  try {
    await apiJson("/v1/summaries", { method: "POST", body: { cameras, start, end } });
    await loadSummaries();
  } catch (error) {
    status(error.message, "error");
  } finally {
    button.disabled = false;
  }
}

export const summariesView = {
  name: "summaries",
  title: "Summaries",
  async enter() {
    status("Loading...");
    $("summary-form").hidden = !canWrite();
    try {
      await loadCameras();
    } catch (error) {
      status(error.message, "error");
      return;
    }
    await loadSummaries();
  },
  leave() {
    if (loading) loading.abort();
  },
};

export function setUp() {
  $("summaries-filters").addEventListener("submit", (event) => { event.preventDefault(); loadSummaries(); });
  $("summaries-camera").addEventListener("change", () => loadSummaries());
  $("summary-form").addEventListener("submit", requestSummary);
}

// Alerts (#/alerts): the rules (the alerts file's and the API's), what fired, newest first, with where each
// message went (pending, delivered, failed and why), and the watch rules' answers (each question the VLM was asked).

import { api, apiJson, canWrite } from "./api.js";
import { answerBadge, badge, h, people, setStatus, timeEl } from "./ui.js";

const $ = (id) => document.getElementById(id);
const PAGE = 50;

let cursor = null;
let loading = null;
let answersBefore = null;
let answersLoading = null;

function status(text, kind = "") {
  setStatus($("alerts-status"), text, kind);
}

function conditions(rule) {
  const parts = [];
  if (rule.words?.length) parts.push(`${rule.all_words ? "all of" : "any of"} “${rule.words.join("”, “")}”`);
  if (rule.semantic) parts.push(`about “${rule.semantic.text}” (similarity ≥ ${rule.semantic.threshold})`);
  if (rule.min_people !== null && rule.min_people !== undefined) parts.push(`at least ${people(rule.min_people)}`);
  if (rule.max_people !== null && rule.max_people !== undefined) parts.push(`at most ${people(rule.max_people)}`);
  if (rule.activities?.length) parts.push(`doing ${rule.activities.join(" or ")}`);
  if (rule.windows?.length) parts.push(`between ${rule.windows.map((w) => `${w.start}–${w.end}`).join(", ")}`);
  const dwell = rule.min_dwell_s !== null && rule.min_dwell_s !== undefined ? ` for ≥ ${rule.min_dwell_s} s` : "";
  if (rule.zones?.length) parts.push(`in ${rule.zones.join(" or ")}${dwell}`);
  else if (dwell) parts.push(`in any zone${dwell}`);
  const asks = rule.verify ? question(rule.verify) : null;
  const filter = parts.length ? parts.join("; ") : "every caption";
  return asks ? [filter, h("div", { class: "rule-question" }, asks)] : filter;
}

function question(verify) {
  const frames = `${verify.max_frames} frame${verify.max_frames === 1 ? "" : "s"}`;
  const similar = verify.min_similarity !== null && verify.min_similarity !== undefined
    ? `, if the caption is about it (similarity ≥ ${verify.min_similarity})` : "";
  return `and the VLM answers yes to “${verify.question}” (up to ${frames}${similar})`;
}

function ruleRow(view) {
  const rule = view.rule;
  return h("tr", { dataset: { rule: rule.name } },
    h("th", { scope: "row" }, rule.name),
    h("td", {}, rule.cameras?.length ? rule.cameras.join(", ") : "all"),
    h("td", {}, conditions(rule)),
    h("td", { class: "num" }, rule.cooldown_s ? `${rule.cooldown_s} s` : "—"),
    h("td", {}, rule.notify?.length ? rule.notify.join(", ") : "all destinations"),
    h("td", {}, badge(view.source === "file" ? "alerts file" : "API", view.source),
      canWrite() && !view.read_only
        ? [
          h("button", { type: "button", class: "secondary small rule-edit", onclick: () => editRule(rule),
            "aria-label": `Change rule ${rule.name}` }, "Change"),
          h("button", { type: "button", class: "secondary small rule-delete", onclick: () => deleteRule(rule.name),
            "aria-label": `Delete rule ${rule.name}` }, "Delete"),
        ]
        : null));
}

// The rule being changed in the form (null: the form adds one).
let editing = null;
// The names a rule's `notify` may pick (the alerts file's destinations); null: the API was given no alerts file.
let destinations = null;

function formMode(rule) {
  editing = rule;
  $("rule-form-heading").textContent = rule ? `Change rule ${rule.name}` : "Add a rule";
  $("rule-submit").textContent = rule ? "Save rule" : "Add rule";
  $("rule-name").readOnly = Boolean(rule);
  $("rule-cancel").hidden = !rule;
}

function editRule(rule) {
  $("rule-form").reset();
  formMode(rule);
  $("rule-name").value = rule.name;
  pick("rule-cameras", rule.cameras);
  $("rule-words").value = (rule.words || []).join(", ");
  $("rule-all-words").checked = Boolean(rule.all_words);
  $("rule-min-people").value = rule.min_people ?? "";
  $("rule-cooldown").value = rule.cooldown_s ?? "";
  $("rule-question").value = rule.verify?.question || "";
  $("rule-frames").value = rule.verify?.max_frames || 1;
  $("rule-deadline").value = rule.verify?.deadline_s ?? "";
  $("rule-question-similarity").value = rule.verify?.min_similarity ?? "";
  $("rule-zones").value = (rule.zones || []).join(", ");
  $("rule-dwell").value = rule.min_dwell_s ?? "";
  $("rule-max-people").value = rule.max_people ?? "";
  $("rule-windows").value = (rule.windows || []).map((w) => `${w.start}-${w.end}`).join(", ");
  $("rule-activities").value = (rule.activities || []).join(", ");
  $("rule-semantic").value = rule.semantic?.text || "";
  $("rule-semantic-threshold").value = rule.semantic?.threshold ?? "";
  pick("rule-notify", rule.notify);
  const more = ["rule-zones", "rule-dwell", "rule-max-people", "rule-windows", "rule-activities", "rule-semantic",
    "rule-question-similarity"].some((id) => $(id).value !== "") || Boolean(rule.notify?.length);
  $("rule-more").open = more;
  ruleStatus(`Changing ${rule.name}: Save replaces its conditions with the form's.`);
  $("rule-question").focus();
}

function ruleStatus(text, kind = "") {
  setStatus($("rule-form-status"), text, kind);
}

async function deleteRule(name) {
  if (!confirm(`Delete rule ${name}? What it fired stays listed.`)) return;
  try {
    await api(`/v1/alerts/rules/${encodeURIComponent(name)}`, { method: "DELETE" });
    status(`Rule ${name} deleted.`);
  } catch (error) {
    status(error.message, "error");
  }
  await loadRules();
}

const list = (id) => $(id).value.split(",").map((part) => part.trim()).filter(Boolean);
const number = (id) => ($(id).value === "" ? null : Number($(id).value));
const picked = (id) => [...$(id).selectedOptions].map((option) => option.value);
const given = (key, value) => (value === null ? {} : { [key]: value });

function pick(id, values) {
  const chosen = new Set(values || []);
  for (const option of $(id).options) option.selected = chosen.has(option.value);
}

// "22:00-06:00, 12:00–13:00" as the API's windows (the input's pattern allows nothing else).
function windows() {
  return list("rule-windows").map((span) => {
    const [start, end] = span.split(/[-–]/).map((part) => part.trim());
    return { start, end };
  });
}

// The form as the API's rule: every field it shows, emptied ones as null or [] (so a change clears them); an
// empty cooldown, deadline or threshold is left out (the API's default for a new rule; a change keeps the
// cooldown), and `notify` too when the API knows no destinations to pick from.
function formRule() {
  const question = $("rule-question").value.trim();
  const about = $("rule-semantic").value.trim();
  return {
    cameras: picked("rule-cameras"),
    words: list("rule-words"),
    all_words: $("rule-all-words").checked,
    min_people: number("rule-min-people"),
    max_people: number("rule-max-people"),
    zones: list("rule-zones"),
    min_dwell_s: number("rule-dwell"),
    windows: windows(),
    activities: list("rule-activities"),
    semantic: about ? { text: about, ...given("threshold", number("rule-semantic-threshold")) } : null,
    verify: question
      ? {
        question,
        max_frames: Number($("rule-frames").value || 1),
        min_similarity: number("rule-question-similarity"),
        ...given("deadline_s", number("rule-deadline")),
      }
      : null,
    ...given("cooldown_s", number("rule-cooldown")),
    ...(destinations === null ? {} : { notify: picked("rule-notify") }),
  };
}

async function addRule(event) {
  event.preventDefault();
  const button = $("rule-submit");
  button.disabled = true;
  try {
    if (editing) {
      const name = editing.name;
      await apiJson(`/v1/alerts/rules/${encodeURIComponent(name)}`, { method: "PATCH", body: formRule() });
      ruleStatus(`Rule ${name} changed: the alerts service applies it from its next page.`, "ok");
    } else {
      const body = { name: $("rule-name").value.trim(), ...formRule() };
      await apiJson("/v1/alerts/rules", { method: "POST", body });
      ruleStatus(`Rule ${body.name} added: the alerts service takes it up at its next page.`, "ok");
    }
    $("rule-form").reset();
    formMode(null);
    await loadRules();
  } catch (error) {
    ruleStatus(error.param ? `${error.message} (field: ${error.param})` : error.message, "error");
  } finally {
    button.disabled = false;
  }
}

async function loadRuleCameras() {
  const cameras = (await apiJson("/v1/cameras")).items.map((camera) => camera.camera);
  const picked = new Set([...$("rule-cameras").selectedOptions].map((option) => option.value));
  $("rule-cameras").replaceChildren(...cameras.map((camera) => new Option(camera, camera, false, picked.has(camera))));
}

function delivery(d) {
  const attempts = `${d.attempts} attempt${d.attempts === 1 ? "" : "s"}`;
  return h("li", { class: `delivery delivery-${d.state}` },
    h("span", { class: "destination" }, d.destination), " ", badge(d.state), h("span", { class: "muted small" }, ` ${attempts}`),
    d.finished_at ? h("span", { class: "muted small" }, " · ", timeEl(d.finished_at)) : null,
    d.last_error ? h("div", { class: "error-text small" }, d.last_error) : null);
}

function alertItem(alert) {
  return h("li", { class: "alert-item", dataset: { id: alert.id } },
    h("div", { class: "alert-head" },
      h("span", { class: "rule-name" }, alert.rule), " · ", alert.camera, " · ", people(alert.people_count),
      h("span", { class: "muted small" }, " · captured ", timeEl(alert.captured_at), " · fired ", timeEl(alert.fired_at))),
    h("a", { href: `#/captions/${alert.caption_id}`, class: "alert-caption" }, alert.caption),
    alert.verification
      ? h("p", { class: "alert-reason small" }, "VLM: “", alert.verification.question, "”: ",
        alert.verification.reason || "(no reason given)")
      : null,
    alert.deliveries.length
      ? h("ul", { class: "deliveries", "aria-label": "Deliveries" }, alert.deliveries.map(delivery))
      : h("p", { class: "muted small" }, "No destination was configured for it."));
}

function answerRow(decision) {
  const said = decision.match === null ? decision.error : decision.reason;
  const tokens = decision.prompt_tokens === null ? "" : ` · ${decision.prompt_tokens} + ${decision.completion_tokens} tokens`;
  return h("tr", { dataset: { id: decision.id } },
    h("td", {}, timeEl(decision.decided_at)),
    h("th", { scope: "row" }, decision.rule),
    h("td", {}, decision.camera),
    h("td", {}, answerBadge(decision),
      decision.alert_id !== null ? h("span", { class: "muted small" }, " fired") : null),
    h("td", { class: decision.match === null ? "error-text" : "" }, said || ""),
    h("td", { class: "num" }, decision.latency_ms === null ? "—" : `${Math.round(decision.latency_ms)} ms`,
      h("span", { class: "muted small" }, tokens)),
    h("td", {}, h("a", { href: `#/captions/${decision.caption_id}` }, `caption ${decision.caption_id}`)));
}

async function loadAnswers(more) {
  const controller = new AbortController();
  if (answersLoading) answersLoading.abort();
  answersLoading = controller;
  const params = [["limit", String(PAGE)]];
  const rule = $("alerts-rule").value;
  if (rule) params.push(["rule", rule]);
  const answered = $("answers-answer").value;
  if (answered) params.push(["answer", answered]);
  if (more) params.push(["before", String(answersBefore)]);
  try {
    const page = await apiJson("/v1/alerts/decisions", { params, signal: controller.signal });
    const count = filled("alert-answers", page.items.map(answerRow), more);
    answersBefore = page.next_cursor;
    $("alert-answers-more").hidden = answersBefore === null;
    $("alert-answers-table").hidden = !count;
    $("alert-answers-note").textContent = count ? "" : "No question asked yet (with these filters).";
  } catch (error) {
    if (error.name === "AbortError") return;
    $("alert-answers-note").textContent = error.message;
  }
}

// A page of `nodes` after those shown (`more`) or instead of them; how many the list shows now.
function filled(id, nodes, more) {
  if (more) $(id).append(...nodes);
  else $(id).replaceChildren(...nodes);
  return $(id).children.length;
}

function showDestinations() {
  const chosen = picked("rule-notify");
  $("rule-notify").replaceChildren(...(destinations || []).map((name) => new Option(name, name, false, chosen.includes(name))));
  $("rule-notify-label").hidden = !destinations?.length;
  $("rule-notify-note").textContent = destinations === null
    ? "Destinations: the API has no alerts file to list them from; set a rule's notify through the API."
    : destinations.length ? "None picked: every destination." : "The alerts file has no destinations.";
}

async function loadRules() {
  const listed = await apiJson("/v1/alerts/rules");
  const rules = listed.items;
  destinations = listed.destinations;
  showDestinations();
  $("alert-rules").replaceChildren(...rules.map(ruleRow));
  $("alert-rules-table").hidden = !rules.length;
  $("alert-rules-note").textContent = rules.length ? "" : "No rules: add one below (a write key), to the alerts file, or through POST /v1/alerts/rules.";
  const select = $("alerts-rule");
  const chosen = select.value;
  select.replaceChildren(new Option("any rule", ""), ...rules.map((view) => new Option(view.rule.name, view.rule.name)));
  select.value = rules.some((view) => view.rule.name === chosen) ? chosen : "";
}

async function loadAlerts(more) {
  const controller = new AbortController();
  if (loading) loading.abort();
  loading = controller;
  // Only parameters GET /v1/alerts declares (it refuses any other).
  const params = [["rule", $("alerts-rule").value], ["state", $("alerts-state").value], ["limit", String(PAGE)]];
  if (more) params.push(["cursor", cursor]);
  try {
    const page = await apiJson("/v1/alerts", { params, signal: controller.signal });
    const count = filled("alert-list", page.items.map(alertItem), more);
    cursor = page.next_cursor;
    $("alerts-more").hidden = !cursor;
    status(count ? `${count} alert${count === 1 ? "" : "s"} shown` : "Nothing fired (with these filters).");
  } catch (error) {
    if (error.name === "AbortError") return;
    status(error.message, "error");
  }
}

export const alertsView = {
  name: "alerts",
  title: "Alerts",
  async enter() {
    status("Loading...");
    $("rule-form").hidden = !canWrite();
    $("rule-form").reset();
    formMode(null);
    ruleStatus("");
    try {
      await Promise.all([loadRules(), canWrite() ? loadRuleCameras() : null]);
    } catch (error) {
      status(error.message, "error");
      return;
    }
    await Promise.all([loadAlerts(false), loadAnswers(false)]);
  },
  leave() {
    if (loading) loading.abort();
    if (answersLoading) answersLoading.abort();
  },
};

export function setUp() {
  $("alerts-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    loadAlerts(false);
    loadAnswers(false);
  });
  $("alerts-rule").addEventListener("change", () => { loadAlerts(false); loadAnswers(false); });
  $("alerts-state").addEventListener("change", () => loadAlerts(false));
  $("alerts-more").addEventListener("click", () => loadAlerts(true));
  $("alert-answers-more").addEventListener("click", () => loadAnswers(true));
  $("answers-answer").addEventListener("change", () => loadAnswers(false));
  $("rule-form").addEventListener("submit", addRule);
  $("rule-cancel").addEventListener("click", () => { $("rule-form").reset(); formMode(null); ruleStatus(""); });
}

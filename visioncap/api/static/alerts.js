// Alerts (#/alerts): the rules (the alerts file's and the API's), and what fired, newest first, with where each
// message went (pending, delivered, failed and why).

import { apiJson } from "./api.js";
import { badge, h, people, setStatus, timeEl } from "./ui.js";

const $ = (id) => document.getElementById(id);
const PAGE = 50;

let cursor = null;
let loading = null;

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
  return parts.length ? parts.join("; ") : "every caption";
}

function ruleRow(view) {
  const rule = view.rule;
  return h("tr", { dataset: { rule: rule.name } },
    h("th", { scope: "row" }, rule.name),
    h("td", {}, rule.cameras?.length ? rule.cameras.join(", ") : "all"),
    h("td", {}, conditions(rule)),
    h("td", { class: "num" }, rule.cooldown_s ? `${rule.cooldown_s} s` : "—"),
    h("td", {}, rule.notify?.length ? rule.notify.join(", ") : "all destinations"),
    h("td", {}, badge(view.source === "file" ? "alerts file" : "API", view.source)));
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
    alert.deliveries.length
      ? h("ul", { class: "deliveries", "aria-label": "Deliveries" }, alert.deliveries.map(delivery))
      : h("p", { class: "muted small" }, "No destination was configured for it."));
}

async function loadRules() {
  const rules = (await apiJson("/v1/alerts/rules")).items;
  $("alert-rules").replaceChildren(...rules.map(ruleRow));
  $("alert-rules-table").hidden = !rules.length;
  $("alert-rules-note").textContent = rules.length ? "" : "No rules: add them to the alerts file or through POST /v1/alerts/rules.";
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
    const items = page.items.map(alertItem);
    if (more) $("alert-list").append(...items);
    else $("alert-list").replaceChildren(...items);
    cursor = page.next_cursor;
    $("alerts-more").hidden = !cursor;
    const count = $("alert-list").children.length;
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
    try {
      await loadRules();
    } catch (error) {
      status(error.message, "error");
      return;
    }
    await loadAlerts(false);
  },
  leave() {
    if (loading) loading.abort();
  },
};

export function setUp() {
  $("alerts-filters").addEventListener("submit", (event) => { event.preventDefault(); loadAlerts(false); });
  $("alerts-rule").addEventListener("change", () => loadAlerts(false));
  $("alerts-state").addEventListener("change", () => loadAlerts(false));
  $("alerts-more").addEventListener("click", () => loadAlerts(true));
}

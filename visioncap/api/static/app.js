// The web app: plain ES modules, no dependencies. A hash router picks the view (#/, #/captions/ID,
// #/timeline/CAMERA?day=..., #/cameras, #/alerts, #/summaries), so every view has an address that survives a reload and can be
// shared. The API key stays in this browser (localStorage) and is sent as a header; images and the live stream are
// fetched with it too (an <img src> or EventSource could not send one).

import { alertsView, setUp as setUpAlerts } from "./alerts.js";
import { loadCapabilities, session, setKey } from "./api.js";
import { camerasView } from "./cameras.js";
import { applyCapabilities, captionsView, refresh, setUp as setUpCaptions } from "./captions.js";
import { detailView } from "./detail.js";
import { setUp as setUpSummaries, summariesView } from "./summaries.js";
import { setUp as setUpTimeline, timelineView } from "./timeline.js";
import { setStatus } from "./ui.js";

const $ = (id) => document.getElementById(id);

const missingView = { name: "missing", title: "Not found", enter() {}, leave() {} };
const views = {
  captions: captionsView, detail: detailView, timeline: timelineView, cameras: camerasView, alerts: alertsView,
  summaries: summariesView, missing: missingView,
};
// The navigation entry each view belongs to.
const NAV = {
  captions: "captions", detail: "captions", timeline: "timeline", cameras: "cameras", alerts: "alerts", summaries: "summaries",
};
const STATUS = {
  captions: "status", detail: "detail-status", timeline: "timeline-status", cameras: "cameras-status", alerts: "alerts-status",
  summaries: "summaries-status",
};

function parse(hash) {
  const [path, query = ""] = hash.replace(/^#/, "").split("?");
  let parts;
  try {
    parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  } catch (_) {
    return ["missing", {}];
  }
  const search = new URLSearchParams(query);
  if (parts.length === 0 || (parts.length === 1 && parts[0] === "captions")) return ["captions", {}];
  if (parts[0] === "captions" && parts.length === 2 && /^\d{1,18}$/.test(parts[1])) return ["detail", { id: parts[1] }];
  if (parts[0] === "timeline" && parts.length <= 2) return ["timeline", { camera: parts[1] || null, day: search.get("day") }];
  if (parts[0] === "cameras" && parts.length === 1) return ["cameras", {}];
  if (parts[0] === "alerts" && parts.length === 1) return ["alerts", {}];
  if (parts[0] === "summaries" && parts.length === 1) return ["summaries", {}];
  return ["missing", {}];
}

let active = null;

function route(moveFocus) {
  const [name, params] = parse(location.hash);
  const view = views[name];
  if (active) active.leave();
  active = view;
  for (const section of document.querySelectorAll("[data-view]")) section.hidden = section.dataset.view !== name;
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === NAV[name]) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${view.title} · visioncap`;
  if (session.key || name === "captions" || name === "missing") view.enter(params);
  else setStatus($(STATUS[name]), "Enter an API key above to see this page (visioncap api-key makes one).");
  // A screen reader hears the new view's heading; a keyboard continues from there.
  if (moveFocus) document.querySelector(`[data-view="${name}"] h1`)?.focus();
}

async function capabilities() {
  try {
    await loadCapabilities();
  } catch (error) {
    const name = active ? active.name : "captions";
    setStatus($(STATUS[name] || "status"), error.message, "error");
  }
  applyCapabilities();
}

async function useKey(key) {
  setKey(key);
  $("key").placeholder = "Key in use";
  await capabilities();
  // The captions view follows the new key at once; another view loads again with it.
  if (!active || active === captionsView) refresh();
  else route(false);
}

async function start() {
  setUpCaptions();
  setUpTimeline();
  setUpAlerts();
  setUpSummaries();
  $("keyform").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key").value.trim();
    $("key").value = "";
    if (key) useKey(key);
  });
  window.addEventListener("hashchange", () => route(true));
  // A key can also come in the address fragment (#key=...), which browsers never send to the server.
  const fragmentKey = location.hash.startsWith("#key=") ? new URLSearchParams(location.hash.slice(1)).get("key") : null;
  if (fragmentKey) {
    setKey(fragmentKey);
    history.replaceState(null, "", location.pathname);
  }
  if (session.key) {
    $("key").placeholder = "Key in use";
    await capabilities();
  }
  route(false);
}

start();

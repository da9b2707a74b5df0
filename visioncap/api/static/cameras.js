// The cameras (#/cameras): each one's state, how fast its frames are analysed, the people in its newest frame,
// its last caption, and pause / resume for keys that may write. Reloaded every few seconds while shown.

import { apiJson, canWrite, session } from "./api.js";
import { ago, badge, dayOf, h, people, setStatus, timeEl } from "./ui.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 5000;
// Rows looked at for the newest caption: the newest row may still be pending.
const NEWEST_ROWS = 5;

let timer = null;
let loading = null;
const samples = new Map(); // camera -> { frames, at }: the report before, to measure the analysed rate

function status(text, kind = "") {
  setStatus($("cameras-status"), text, kind);
}

// Frames analysed per second between two reports of the same run; without two yet, the average since the camera
// came online; the configured rate is the last resort (its `analyze_fps`, a cap).
function rate(camera) {
  const at = camera.reported_at ? Date.parse(camera.reported_at) : null;
  const before = samples.get(camera.camera);
  let measured = null;
  if (before && at && camera.frames_analysed !== null) {
    if (at > before.at && camera.frames_analysed >= before.frames) {
      measured = (camera.frames_analysed - before.frames) / ((at - before.at) / 1000);
      samples.set(camera.camera, { frames: camera.frames_analysed, at, measured });
    } else {
      measured = before.measured;
    }
  } else if (at && camera.frames_analysed !== null) {
    samples.set(camera.camera, { frames: camera.frames_analysed, at, measured: null });
  }
  if (measured === null && camera.state === "online" && camera.state_since && at && camera.frames_analysed) {
    const seconds = (at - Date.parse(camera.state_since)) / 1000;
    if (seconds > 0) measured = camera.frames_analysed / seconds;
  }
  if (camera.state !== "online" && camera.state !== "starting") return { text: "—", title: "not analysing now" };
  if (measured !== null) return { text: `${measured.toFixed(1)} fps`, title: `${camera.frames_analysed} frames analysed in this run` };
  const target = camera.config?.source?.analyze_fps;
  return target ? { text: `up to ${target} fps`, title: "the configured rate; no measurement yet" } : { text: "—", title: "no measurement yet" };
}

function stateCell(camera) {
  const paused = camera.config?.paused;
  const shown = paused ? "paused" : camera.state || "unknown";
  return h("td", {},
    badge(shown, shown),
    camera.state_since && !paused ? h("span", { class: "muted small" }, " since ", timeEl(camera.state_since, ago(camera.state_since))) : null,
    camera.error ? h("div", { class: "error-text small" }, camera.error) : null);
}

async function setPaused(camera, paused, button) {
  button.disabled = true;
  try {
    await apiJson(`/v1/cameras/${encodeURIComponent(camera)}`, { method: "PATCH", body: { paused } });
    status(paused ? `${camera} is paused: its worker stops reading it within seconds.` : `${camera} resumes within seconds.`, "ok");
    await load();
  } catch (error) {
    status(error.message, "error");
    button.disabled = false;
  }
}

function row(camera, newest) {
  const latest = newest[0];
  const captioned = newest.find((item) => item.status === "captioned");
  const fps = rate(camera);
  const actions = h("td", { class: "actions-cell" });
  if (canWrite() && camera.config) {
    const paused = camera.config.paused;
    const button = h("button", { type: "button", class: paused ? "" : "secondary", "aria-label": `${paused ? "Resume" : "Pause"} ${camera.camera}` }, paused ? "Resume" : "Pause");
    button.addEventListener("click", () => setPaused(camera.camera, !paused, button));
    actions.append(button);
  } else if (canWrite()) {
    actions.append(h("span", { class: "muted small" }, "not configured here"));
  }
  const last = camera.last_caption_at || camera.last_frame_at;
  return h("tr", { dataset: { camera: camera.camera } },
    h("th", { scope: "row" }, h("a", { href: `#/timeline/${encodeURIComponent(camera.camera)}${last ? `?day=${dayOf(Date.parse(last))}` : ""}`, title: "Open its timeline" }, camera.camera),
      camera.pipeline ? h("div", { class: "muted small" }, camera.pipeline) : null),
    stateCell(camera),
    h("td", { class: "num fps", title: fps.title }, fps.text),
    h("td", { class: "num people-now" }, latest ? String(latest.people_count) : "—"),
    h("td", { class: "last-caption" }, captioned
      ? h("a", { href: `#/captions/${captioned.id}` }, captioned.caption, h("span", { class: "muted small" }, " · ", timeEl(captioned.captured_at, ago(captioned.captured_at))))
      : h("span", { class: "muted" }, "none yet")),
    h("td", { class: "num" }, String(camera.captions)),
    actions);
}

async function load() {
  const controller = new AbortController();
  if (loading) loading.abort();
  loading = controller;
  try {
    const cameras = (await apiJson("/v1/cameras", { signal: controller.signal })).items;
    const limit = String(Math.min(NEWEST_ROWS, session.caps.max_page_size || NEWEST_ROWS));
    const newest = await Promise.all(cameras.map((camera) => apiJson("/v1/captions", {
      params: [["camera", camera.camera], ["limit", limit]], signal: controller.signal,
    }).then((page) => page.items).catch(() => [])));
    if (controller.signal.aborted) return;
    $("cameras-rows").replaceChildren(...cameras.map((camera, index) => row(camera, newest[index])));
    $("cameras-table").hidden = cameras.length === 0;
    if (!cameras.length) status("No cameras yet: add one (visioncap cameras add) or run a pipeline.");
    else if ($("cameras-status").classList.contains("error")) status("");
    $("cameras-updated").textContent = `Updated ${new Date().toLocaleTimeString()}; refreshed every ${POLL_MS / 1000} s.`;
  } catch (error) {
    if (error.name === "AbortError") return;
    status(error.message, "error");
  }
}

export const camerasView = {
  name: "cameras",
  title: "Cameras",
  enter() {
    status("");
    load();
    clearInterval(timer);
    timer = setInterval(() => { if (!document.hidden) load(); }, POLL_MS);
  },
  leave() {
    clearInterval(timer);
    timer = null;
    if (loading) loading.abort();
  },
};

// A camera's day (#/timeline/CAMERA?day=YYYY-MM-DD): its captions as marks over the day, zoomable (buttons, the
// mouse wheel, dragging), each mark opening the caption. The list under the track holds the marks in view.

import { allCaptions, apiJson } from "./api.js";
import { clock, dayOf, dayStart, h, people, setStatus, validDay } from "./ui.js";

const $ = (id) => document.getElementById(id);
const DAY_MS = 24 * 3600 * 1000;
const MIN_SPAN_MS = 5 * 60 * 1000;
const MAX_PAGES = 25; // 25 pages of up to 200: at most 5,000 marks a day are drawn
const LIST_MAX = 200;
const TICK_STEPS_MIN = [1, 2, 5, 10, 15, 30, 60, 120, 180, 360];

const view = { camera: null, day: null, start: 0, end: 0, from: 0, to: 0, items: [], more: false, loading: null };

function status(text, kind = "") {
  setStatus($("timeline-status"), text, kind);
}

function hashFor(camera, day) {
  return `#/timeline/${encodeURIComponent(camera)}?day=${day}`;
}

function go(camera, day) {
  location.hash = hashFor(camera, day);
}

function shiftDay(day, days) {
  const start = new Date(dayStart(day));
  start.setDate(start.getDate() + days);
  return dayOf(start.getTime());
}

function setRange(from, to) {
  const span = Math.min(view.end - view.start, Math.max(MIN_SPAN_MS, to - from));
  let start = Math.max(view.start, from);
  start = Math.min(start, view.end - span);
  view.from = start;
  view.to = start + span;
  draw();
}

function zoom(factor, at = 0.5) {
  const span = view.to - view.from;
  const centre = view.from + span * at;
  const next = span * factor;
  setRange(centre - next * at, centre - next * at + next);
}

function pan(fraction) {
  const span = view.to - view.from;
  setRange(view.from + span * fraction, view.to + span * fraction);
}

function ticks() {
  const span = view.to - view.from;
  const step = (TICK_STEPS_MIN.find((minutes) => span / (minutes * 60000) <= 12) || 360) * 60000;
  const out = [];
  // Steps count from the local midnight, so an hour tick sits on the hour.
  for (let t = view.start + Math.ceil((view.from - view.start) / step) * step; t <= view.to; t += step) out.push(t);
  return out;
}

function markLabel(item) {
  const text = item.caption ?? (item.status === "pending" ? "waiting for a caption" : item.error ?? item.status);
  return `${clock(Date.parse(item.captured_at), true)}, ${people(item.people_count)}: ${text}`;
}

function preview(item) {
  $("timeline-preview").textContent = item ? markLabel(item) : "Point at a mark or focus it to read its caption; select it to open it.";
}

function draw() {
  const span = view.to - view.from;
  const position = (t) => `${((t - view.from) / span) * 100}%`;
  const axis = ticks().map((t) => {
    const tick = h("span", { class: "tick" }, clock(t));
    tick.style.left = position(t);
    return tick;
  });
  $("timeline-axis").replaceChildren(...axis);
  const inView = view.items.filter((item) => {
    const t = Date.parse(item.captured_at);
    return t >= view.from && t < view.to;
  });
  const marks = inView.map((item) => {
    const mark = h("a", {
      href: `#/captions/${item.id}`,
      class: `mark mark-${item.status}`,
      "aria-label": markLabel(item),
      title: markLabel(item),
      dataset: { id: item.id },
    });
    mark.style.left = position(Date.parse(item.captured_at));
    // Taller for more people: a crowd stands out at a glance.
    mark.style.height = `${Math.min(100, 35 + 15 * item.people_count)}%`;
    mark.addEventListener("focus", () => preview(item));
    mark.addEventListener("mouseenter", () => preview(item));
    return mark;
  });
  $("timeline-marks").replaceChildren(...marks);
  $("timeline-range").textContent = `${clock(view.from)}–${span >= DAY_MS ? "24:00" : clock(view.to)} · ${inView.length} of ${view.items.length} captions in view`
    + (view.more ? ` (the day has more than ${view.items.length}: only these are drawn)` : "");
  $("timeline-list").replaceChildren(...inView.slice(0, LIST_MAX).map((item) => h("li", {},
    h("a", { href: `#/captions/${item.id}` },
      h("time", { datetime: item.captured_at }, clock(Date.parse(item.captured_at), true)),
      ` · ${people(item.people_count)} · `,
      item.caption ?? item.status))));
  $("timeline-list-note").textContent = inView.length > LIST_MAX ? `The first ${LIST_MAX} are listed; zoom in for the others.` : "";
  $("timeline-zoom-in").disabled = span <= MIN_SPAN_MS;
  $("timeline-zoom-out").disabled = $("timeline-reset").disabled = span >= view.end - view.start;
  $("timeline-earlier").disabled = view.from <= view.start;
  $("timeline-later").disabled = view.to >= view.end;
}

async function cameras() {
  return (await apiJson("/v1/cameras")).items;
}

export const timelineView = {
  name: "timeline",
  title: "Timeline",
  async enter({ camera, day }) {
    const controller = new AbortController();
    if (view.loading) view.loading.abort();
    view.loading = controller;
    status("Loading...");
    try {
      const known = await cameras();
      if (controller.signal.aborted) return;
      const select = $("timeline-camera");
      select.replaceChildren(...known.map((c) => new Option(c.camera, c.camera)));
      if (!known.length) {
        status("No cameras yet: the timeline fills once a pipeline stores captions.");
        return;
      }
      let chosen = known.find((c) => c.camera === camera);
      if (camera && !chosen) {
        status(`No camera named ${camera} (or this key may not see it).`, "error");
        return;
      }
      // No camera or day asked for: the camera captioned last, on the day of its newest caption.
      chosen = chosen || [...known].sort((a, b) => (b.last_caption_at || "").localeCompare(a.last_caption_at || ""))[0];
      const last = chosen.last_caption_at || chosen.last_frame_at;
      const shownDay = validDay(day) ? day : dayOf(last ? Date.parse(last) : Date.now());
      if (chosen.camera !== camera || shownDay !== day) history.replaceState(null, "", hashFor(chosen.camera, shownDay));
      select.value = chosen.camera;
      $("timeline-day").value = shownDay;
      $("timeline-heading").textContent = `Timeline · ${chosen.camera}`;
      document.title = `Timeline · ${chosen.camera} · visioncap`;
      $("timeline-track").setAttribute("aria-label", `Captions of ${chosen.camera} on ${new Date(dayStart(shownDay)).toLocaleDateString()}`);
      const sameDay = view.camera === chosen.camera && view.day === shownDay;
      view.camera = chosen.camera;
      view.day = shownDay;
      view.start = dayStart(shownDay);
      view.end = dayStart(shiftDay(shownDay, 1)); // not start + 24 h: a day with a clock change is 23 or 25 h
      const params = [["camera", chosen.camera], ["since", new Date(view.start).toISOString()], ["until", new Date(view.end).toISOString()]];
      const found = await allCaptions(params, MAX_PAGES, controller.signal);
      if (controller.signal.aborted) return;
      view.items = found.items.reverse(); // oldest first, as the day runs
      view.more = found.more;
      if (!sameDay) { view.from = view.start; view.to = view.end; }
      preview(null);
      draw();
      status(view.items.length ? "" : "No captions on this day.");
    } catch (error) {
      if (error.name === "AbortError") return;
      status(error.message, "error");
    }
  },
  leave() {
    if (view.loading) view.loading.abort();
  },
};

export function setUp() {
  $("timeline-camera").addEventListener("change", (event) => go(event.target.value, $("timeline-day").value || dayOf(Date.now())));
  $("timeline-day").addEventListener("change", (event) => { if (validDay(event.target.value)) go(view.camera, event.target.value); });
  $("timeline-prev").addEventListener("click", () => go(view.camera, shiftDay(view.day, -1)));
  $("timeline-next").addEventListener("click", () => go(view.camera, shiftDay(view.day, 1)));
  $("timeline-zoom-in").addEventListener("click", () => zoom(0.5));
  $("timeline-zoom-out").addEventListener("click", () => zoom(2));
  $("timeline-reset").addEventListener("click", () => setRange(view.start, view.end));
  $("timeline-earlier").addEventListener("click", () => pan(-0.5));
  $("timeline-later").addEventListener("click", () => pan(0.5));
  const track = $("timeline-track");
  track.addEventListener("wheel", (event) => {
    event.preventDefault();
    const box = track.getBoundingClientRect();
    zoom(event.deltaY < 0 ? 0.8 : 1.25, Math.min(1, Math.max(0, (event.clientX - box.left) / box.width)));
  }, { passive: false });
  // Dragging the track pans it (a mark is a link: dragging from one is left to the browser).
  let drag = null;
  track.addEventListener("pointerdown", (event) => {
    if (event.target.closest("a")) return;
    drag = { x: event.clientX, from: view.from, to: view.to, width: track.getBoundingClientRect().width };
    track.setPointerCapture(event.pointerId);
  });
  track.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const shift = ((drag.x - event.clientX) / drag.width) * (drag.to - drag.from);
    setRange(drag.from + shift, drag.to + shift);
  });
  const stop = () => { drag = null; };
  track.addEventListener("pointerup", stop);
  track.addEventListener("pointercancel", stop);
}

// One caption (#/captions/ID): the frame with the detected people drawn, its fields and structured fields, an event
// description's frames, the other captions of its event, re-caption (write keys) and a link to copy.

import { Images, apiJson, canWrite, session } from "./api.js";
import { answerBadge, badge, dayOf, h, people, setStatus, timeEl, whenLocal } from "./ui.js";

const $ = (id) => document.getElementById(id);
// The event's captions are looked for this far either side of the caption (the API filters by time, not event).
const EVENT_WINDOW_MS = 2 * 3600 * 1000;
const EVENT_MAX_SHOWN = 24;

let images = new Images();
let current = null; // the AbortController of the caption being shown

function status(text, kind = "") {
  setStatus($("detail-status"), text, kind);
}

function linkOf(id) {
  return `${location.origin}${location.pathname}#/captions/${id}`;
}

function field(term, ...value) {
  return [h("dt", {}, term), h("dd", {}, ...value)];
}

function structuredValue(value) {
  if (value === null || value === undefined) return "—";
  if (Array.isArray(value)) {
    if (value.every((item) => typeof item !== "object" || item === null)) return value.length ? value.join(", ") : "—";
    return h("ul", { class: "plain" }, value.map((item) => h("li", {}, structuredValue(item))));
  }
  if (typeof value === "object") {
    return h("dl", { class: "nested" }, Object.entries(value).map(([key, inner]) => field(key, structuredValue(inner))));
  }
  return String(value);
}

function fields(caption) {
  const tokens = [
    caption.prompt_tokens !== null ? `${caption.prompt_tokens} prompt` : null,
    caption.completion_tokens !== null ? `${caption.completion_tokens} caption` : null,
    `${caption.image_tokens} image`,
  ].filter(Boolean).join(" · ");
  return h("dl", { class: "fields" },
    field("Camera", h("a", { href: `#/timeline/${encodeURIComponent(caption.camera)}?day=${dayOf(Date.parse(caption.captured_at))}` }, caption.camera)),
    field("Captured", timeEl(caption.captured_at), h("span", { class: "muted" }, ` (${caption.captured_at} UTC)`)),
    field("People", people(caption.people_count)),
    caption.zones && caption.zones.length
      ? field("Zones", caption.zones.map((stay) => `${stay.zone} (track ${stay.track_id}, ${Math.round(stay.dwell_s)} s there)`).join(", "))
      : null,
    field("Status", badge(caption.status)),
    field("Why selected", caption.reason),
    field("Event", h("code", {}, caption.event_key), caption.event_ids.length ? ` · tracks ${caption.event_ids.join(", ")}` : ""),
    field("Model", caption.model),
    field("Tokens", tokens),
    field("Latency", caption.latency_ms !== null ? `${Math.round(caption.latency_ms)} ms` : "—"),
    field("Attempts", String(caption.attempts)),
    field("Frame score", caption.score.toFixed(2)),
    field("Source", h("code", {}, caption.source)),
    caption.error ? field("Error", h("span", { class: "error-text" }, caption.error)) : null,
  );
}

async function copyLink(id) {
  const link = linkOf(id);
  try {
    await navigator.clipboard.writeText(link);
    status("Link copied to the clipboard.", "ok");
  } catch (_) {
    // No clipboard permission (an http page, a denied prompt): the link is selected to copy by hand.
    const input = $("detail-link");
    input.focus();
    input.select();
    status("Press Ctrl+C to copy the selected link.");
  }
}

async function recaption(caption, button) {
  button.disabled = true;
  try {
    const answer = await apiJson(`/v1/captions/${caption.id}/regenerate`, { method: "POST" });
    status(`Queued for a new caption: ${answer.detail}`, "ok");
    const badgeNode = $("detail-body").querySelector(".fields .badge");
    if (badgeNode) badgeNode.replaceWith(badge(answer.status));
  } catch (error) {
    status(error.message, "error");
    button.disabled = false;
  }
}

function eventItem(other, shownId) {
  const img = h("img", { alt: other.caption || `frame of ${other.camera}`, loading: "lazy" });
  images.into(img, other.image_url);
  const here = other.id === shownId;
  return h("li", {},
    h("a", { href: `#/captions/${other.id}`, class: here ? "event-item current" : "event-item", "aria-current": here ? "page" : null },
      img,
      h("span", { class: "event-meta" }, timeEl(other.captured_at, new Date(other.captured_at).toLocaleTimeString()), ` · ${people(other.people_count)}`),
      h("span", { class: "event-text" }, other.caption ?? other.status)));
}

function askedItem(decision) {
  const said = decision.match === null ? decision.error : decision.reason;
  return h("li", { dataset: { id: decision.id } },
    h("span", { class: "rule-name" }, decision.rule), " ", answerBadge(decision), " ",
    h("span", { class: decision.match === null ? "error-text" : "" }, said || ""),
    h("span", { class: "muted small" }, ` · “${decision.question}” · `, timeEl(decision.decided_at)));
}

async function loadAsked(caption, signal) {
  try {
    // A caption is asked about once per watch rule (a page that rolled back may ask again): one page holds them.
    const page = await apiJson("/v1/alerts/decisions", { params: [["caption_id", String(caption.id)], ["limit", "50"]], signal });
    const panel = $("detail-asked-panel");
    panel.dataset.answers = String(page.items.length); // the panel stays hidden when none: this says it looked
    $("detail-asked").replaceChildren(...page.items.map(askedItem));
    panel.hidden = !page.items.length;
  } catch (error) {
    if (error.name === "AbortError") return;
    $("detail-asked").replaceChildren(h("li", { class: "error-text" }, `The watch rules' answers could not be loaded: ${error.message}`));
    $("detail-asked-panel").hidden = false;
  }
}

async function loadEvent(caption, signal) {
  const list = $("detail-event");
  const at = Date.parse(caption.captured_at);
  const params = [
    ["camera", caption.camera],
    ["since", new Date(at - EVENT_WINDOW_MS).toISOString()],
    ["until", new Date(at + EVENT_WINDOW_MS).toISOString()],
    ["limit", String(Math.min(200, session.caps.max_page_size || 50))],
  ];
  try {
    // One page of up to 200 rows of this camera around the caption; the event's are picked from them.
    const page = await apiJson("/v1/captions", { params, signal });
    const same = page.items.filter((item) => item.event_key === caption.event_key).reverse();
    const shown = same.slice(0, EVENT_MAX_SHOWN);
    list.replaceChildren(...shown.map((item) => eventItem(item, caption.id)));
    $("detail-event-note").textContent = same.length <= 1
      ? "This is the event's only caption within two hours."
      : `${same.length} captions of event ${caption.event_key}, oldest first${same.length > shown.length ? ` (first ${shown.length} shown)` : ""}.`;
  } catch (error) {
    if (error.name === "AbortError") return;
    $("detail-event-note").textContent = `The event's captions could not be loaded: ${error.message}`;
  }
}

const ROLE_NAMES = { first: "first seen", best: "best", last: "last seen" };

function roleText(role) {
  return role.split("+").map((part) => (part.startsWith("zone:") ? `entered ${part.slice(5)}` : ROLE_NAMES[part] || part)).join(", ");
}

// An event description (reason event-end): the frames it was written from, oldest first, as the VLM saw them.
function descriptionFrames(caption) {
  if (!caption.frames || !caption.frames.length) return null;
  const items = caption.frames.map((frame, number) => {
    const img = h("img", { alt: `Frame ${number + 1} of ${caption.frames.length}: ${roleText(frame.role)}`, loading: "lazy" });
    images.into(img, frame.image_url);
    return h("li", {}, h("figure", { class: "description-frame" }, img,
      h("figcaption", {}, `${roleText(frame.role)} · ${frame.offset_s.toFixed(1)} s · ${frame.image_tokens} tokens`)));
  });
  return h("section", { class: "panel", "aria-labelledby": "frames-heading" },
    h("h2", { id: "frames-heading" }, "Frames this description was written from"),
    h("p", { class: "muted" }, `${caption.frames.length} frames of the event, oldest first, sent as the images of one request.`),
    h("ol", { id: "detail-frames", class: "event-list" }, items));
}

function render(caption) {
  const img = h("img", { id: "detail-image", alt: caption.caption ? `Frame: ${caption.caption}` : `Frame of ${caption.camera}` });
  const figure = h("figure", { class: "frame" }, img,
    h("figcaption", {}, `${caption.camera} · ${whenLocal(caption.captured_at)} · ${people(caption.people_count)}, outlined${caption.zones && caption.zones.length ? "; zones in amber" : ""}`));
  if (caption.image_url) {
    // The people drawn by the server (it knows where the stored image sits in the frame); a row without the
    // frame's size has no boxes to draw: the plain image then.
    images.load(`${caption.image_url}?boxes=true`)
      .catch(() => images.load(caption.image_url))
      .then((url) => { img.src = url; })
      .catch(() => { img.alt = "The image is no longer stored."; figure.classList.add("missing"); });
  } else {
    img.alt = "No image was stored for this caption.";
    figure.classList.add("missing");
  }

  const actions = h("div", { class: "actions" },
    h("label", { class: "link-field" }, h("span", { class: "visually-hidden" }, "Link to this caption"),
      h("input", { id: "detail-link", type: "text", readonly: true, value: linkOf(caption.id) })),
    h("button", { type: "button", id: "detail-copy", onclick: () => copyLink(caption.id) }, "Copy link"));
  if (canWrite()) {
    const button = h("button", { type: "button", id: "detail-recaption", class: "secondary" }, "Re-caption");
    button.addEventListener("click", () => recaption(caption, button));
    actions.append(button);
  }

  const structured = caption.structured && Object.keys(caption.structured).length
    ? h("section", { class: "panel", "aria-labelledby": "structured-heading" },
      h("h2", { id: "structured-heading" }, "Structured fields"),
      h("dl", { class: "fields structured" }, Object.entries(caption.structured).map(([key, value]) => field(key, structuredValue(value)))))
    : null;

  // Panels a caption has not (structured fields, description frames) are null: left out, not shown as "null".
  $("detail-body").replaceChildren(...[
    h("div", { class: "detail-grid" },
      figure,
      h("div", { class: "detail-side" },
        h("p", { class: "caption-text", id: "detail-text" }, caption.caption ?? caption.error ?? `(${caption.status}: no caption yet)`),
        actions,
        fields(caption))),
    structured,
    descriptionFrames(caption),
    h("section", { class: "panel", id: "detail-asked-panel", "aria-labelledby": "asked-heading", hidden: true },
      h("h2", { id: "asked-heading" }, "Watch rules' answers"),
      h("ul", { id: "detail-asked", class: "asked-list" })),
    h("section", { class: "panel", "aria-labelledby": "event-heading" },
      h("h2", { id: "event-heading" }, "This event's captions"),
      h("p", { id: "detail-event-note", class: "muted" }, "Loading..."),
      h("ol", { id: "detail-event", class: "event-list" })),
  ].filter(Boolean));
}

export const detailView = {
  name: "detail",
  title: "Caption",
  async enter({ id }) {
    this.leave();
    current = new AbortController();
    const signal = current.signal;
    $("detail-heading").textContent = `Caption ${id}`;
    $("detail-body").replaceChildren();
    status("Loading...");
    try {
      const caption = await apiJson(`/v1/captions/${id}`, { signal });
      if (signal.aborted) return;
      document.title = `Caption ${id} · ${caption.camera} · visioncap`;
      $("detail-heading").textContent = `Caption ${id} · ${caption.camera}`;
      render(caption);
      status("");
      loadEvent(caption, signal);
      loadAsked(caption, signal);
    } catch (error) {
      if (error.name === "AbortError") return;
      status(error.status === 404 ? `Caption ${id} does not exist, or this key may not see its camera.` : error.message, "error");
    }
  },
  leave() {
    if (current) current.abort();
    current = null;
    images.release();
    images = new Images();
  },
};

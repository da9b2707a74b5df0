// The captions view (#/): search, camera and time filters, live captions, and the Ask panel. Each card opens the
// caption's detail (#/captions/ID).

import { api, authHeaders, readError, session } from "./api.js";
import { setStatus } from "./ui.js";

const $ = (id) => document.getElementById(id);
const state = {
  cursor: null,
  stream: null,
  lastEventId: null,
  shown: new Set(),
  generation: 0, // counts refresh() calls: a list answered after a newer refresh began is not shown
  started: false,
};
const imageUrls = new Map();

function status(text, error = false) {
  setStatus($("status"), text, error ? "error" : "");
}

function toUtc(localValue) {
  return localValue ? new Date(localValue).toISOString() : null;
}

function mode() {
  // The switch is shown only where the server ranks by meaning; hidden, it is words.
  return session.caps.semantic_search ? $("mode").value : "words";
}

function filterParams() {
  const params = [];
  const q = $("q").value.trim();
  const how = mode();
  if (q && how === "words") params.push(["q", q]);
  if (q && how !== "words") params.push(["semantic", q]);
  if (q && how === "hybrid") params.push(["hybrid", "true"]);
  for (const option of $("camera").selectedOptions) params.push(["camera", option.value]);
  const since = toUtc($("since").value);
  const until = toUtc($("until").value);
  if (since) params.push(["since", since]);
  if (until) params.push(["until", until]);
  const people = Number($("min_people").value || 0);
  if (people > 0) params.push(["min_people", String(people)]);
  const zones = zoneNames();
  if (zones.length) params.push(["zone", zones.join(",")]);
  return params;
}

function zoneNames() {
  return $("zone").value.split(",").map((name) => name.trim()).filter(Boolean);
}

// "back-door 61 s, yard 4 s": where the frame's people stood, and for how long so far.
function zonesText(caption) {
  return (caption.zones || []).map((stay) => `${stay.zone} ${Math.round(stay.dwell_s)} s`).join(", ");
}

async function loadImage(img, caption) {
  if (!caption.image_url) return;
  try {
    const blob = await (await api(caption.image_url)).blob();
    const url = URL.createObjectURL(blob);
    imageUrls.set(caption.id, url);
    img.src = url;
  } catch (_) {
    img.alt = "image not available";
  }
}

function card(caption, fresh) {
  const node = $("card").content.firstElementChild.cloneNode(true);
  node.dataset.id = caption.id;
  if (fresh) node.classList.add("new");
  node.querySelector("a").href = `#/captions/${caption.id}`;
  node.querySelector(".camera").textContent = caption.camera;
  const time = node.querySelector("time");
  time.dateTime = caption.captured_at;
  time.textContent = new Date(caption.captured_at).toLocaleString();
  node.querySelector(".people").textContent = `${caption.people_count} ${caption.people_count === 1 ? "person" : "people"}`;
  node.querySelector(".zones").textContent = zonesText(caption) ? `in ${zonesText(caption)}` : "";
  const shownState = node.querySelector(".state");
  shownState.textContent = caption.status === "captioned" ? "" : caption.status;
  shownState.classList.add(caption.status);
  node.querySelector(".text").textContent = caption.caption ?? caption.error ?? "";
  // Why a search by meaning found it: its similarity, and in hybrid the search's words its caption has.
  const why = [];
  if (typeof caption.similarity === "number") why.push(`similarity ${caption.similarity.toFixed(2)}`);
  if (caption.matched_words?.length) why.push(`matched ${caption.matched_words.map((word) => `“${word}”`).join(", ")}`);
  node.querySelector(".why").textContent = why.join(" · ");
  const img = node.querySelector("img");
  img.alt = caption.caption || `frame of ${caption.camera}`;
  loadImage(img, caption);
  return node;
}

function clearCards() {
  for (const url of imageUrls.values()) URL.revokeObjectURL(url);
  imageUrls.clear();
  state.shown.clear();
  $("captions").replaceChildren();
}

async function loadPage() {
  const generation = state.generation;
  const params = filterParams();
  params.push(["limit", String(Math.min(48, session.caps.max_page_size || 48))]);
  if (state.cursor) params.push(["cursor", state.cursor]);
  status("Loading...");
  try {
    const page = await (await api("/v1/captions", { params })).json();
    if (generation !== state.generation) return; // the filters changed meanwhile: a newer list is on its way
    for (const caption of page.items) {
      if (state.shown.has(caption.id)) continue;
      state.shown.add(caption.id);
      $("captions").append(card(caption, false));
    }
    state.cursor = page.next_cursor;
    $("more").hidden = !state.cursor;
    status(`${state.shown.size} captions shown`);
  } catch (error) {
    status(error.message, true);
  }
}

async function loadCameras() {
  try {
    const cameras = (await (await api("/v1/cameras")).json()).items;
    const select = $("camera");
    const chosen = new Set([...select.selectedOptions].map((option) => option.value));
    select.replaceChildren(...cameras.map((camera) => {
      const label = camera.state ? `${camera.camera} · ${camera.state}` : camera.camera;
      const option = new Option(`${label} (${camera.captions})`, camera.camera);
      option.selected = chosen.has(camera.camera);
      return option;
    }));
    select.size = Math.min(4, Math.max(1, cameras.length));
  } catch (_) { /* shown by loadPage */ }
}

// Camera counts and states change as captions arrive and pipelines report: reload the list after live
// captions (at most every few seconds) and on a slow timer for cameras the stream's filter leaves out.
const CAMERAS_MIN_INTERVAL_MS = 3000;
const CAMERAS_POLL_MS = 30000;
let camerasTimer = null;
let camerasLoadedAt = 0;

function camerasSoon() {
  if (camerasTimer) return;
  const wait = Math.max(0, camerasLoadedAt + CAMERAS_MIN_INTERVAL_MS - Date.now());
  camerasTimer = setTimeout(() => {
    camerasTimer = null;
    camerasLoadedAt = Date.now();
    loadCameras();
  }, wait);
}

function matchesFilters(caption) {
  // The stream filters cameras and people on the server; time, text and zones are checked here.
  const q = $("q").value.trim().toLowerCase();
  // A ranked list has no place for a caption by its time: live captions wait for the next search.
  if (q && mode() !== "words") return false;
  if (q && !q.split(/\W+/).filter(Boolean).every((word) => (caption.caption || "").toLowerCase().includes(word))) return false;
  const zones = zoneNames();
  if (zones.length && !(caption.zones || []).some((stay) => zones.includes(stay.zone))) return false;
  const until = toUtc($("until").value);
  return !(until && caption.captured_at >= until);
}

// The events of a server-sent event stream as they arrive, each a block of lines (an event ends at a blank line).
async function* eventBlocks(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      yield block;
    }
  }
}

// An event's data: its `data:` lines joined, as EventSource joins them.
function eventData(lines) {
  return lines.filter((line) => line.startsWith("data: ")).map((line) => line.slice(6)).join("\n");
}

// `resume`: a reconnect of the same stream, which sends the last event id so the server sends what was missed.
// `opened` is called once the stream has started (its first block, which carries the start position, arrived)
// or could not start: a list loaded after that misses nothing the stream does not then send.
async function follow(resume = false, opened = () => {}) {
  if (state.stream) state.stream.abort();
  if (!resume) state.lastEventId = null;
  if (!$("live").checked || !session.key) { opened(); return; }
  const controller = new AbortController();
  state.stream = controller;
  const params = filterParams().filter(([name]) => name === "camera" || name === "min_people");
  const url = new URL("/v1/stream", location.origin);
  for (const [name, value] of params) url.searchParams.append(name, value);
  try {
    const sent = state.lastEventId ? { ...authHeaders(), "Last-Event-ID": state.lastEventId } : authHeaders();
    const response = await fetch(url, { headers: sent, signal: controller.signal });
    if (!response.ok) throw await readError(response);
    for await (const block of eventBlocks(response)) {
      const lines = block.split("\n");
      const id = lines.find((line) => line.startsWith("id: "));
      if (id) state.lastEventId = id.slice(4); // keep-alives carry one too
      opened();
      const data = eventData(lines);
      if (!block.includes("event: caption") || !data) continue;
      const caption = JSON.parse(data);
      if (!matchesFilters(caption)) continue;
      // A row captioned again (regenerate), or one the list loaded too, comes again: its new card replaces the old.
      if (state.shown.has(caption.id)) $("captions").querySelector(`[data-id="${caption.id}"]`)?.remove();
      state.shown.add(caption.id);
      $("captions").prepend(card(caption, true));
      status(`${state.shown.size} captions shown (live)`);
      camerasSoon();
    }
  } catch (error) {
    if (error.name === "AbortError") return;
    status(`live updates paused: ${error.message}`, true);
  } finally {
    opened();
  }
  if (state.stream === controller) setTimeout(() => follow(true), 3000); // reconnect where it stopped
}

// -- Ask: POST /v1/chat/completions, streamed; the citations come on the first chunk, before the answer's text --

let asking = null;

function citationLink(citation) {
  const link = document.createElement("a");
  link.className = "citation";
  link.dataset.id = citation.caption_id;
  link.target = "_blank";
  link.rel = "noopener";
  link.title = citation.caption;
  const img = document.createElement("img");
  img.alt = citation.caption;
  const label = document.createElement("span");
  label.textContent = `[${citation.caption_id}] ${citation.camera} · ${new Date(citation.captured_at).toLocaleString()}`;
  link.append(img, label);
  if (citation.image_url) {
    // The thumbnail opens the full image (fetched with the key: a plain link could not send it).
    api(citation.image_url).then((response) => response.blob()).then((blob) => {
      const url = URL.createObjectURL(blob);
      img.src = url;
      link.href = url;
    }).catch(() => { img.alt = "image not available"; });
  } else {
    link.href = `#/captions/${citation.caption_id}`;
    link.removeAttribute("target");
  }
  return link;
}

async function askQuestion(question) {
  if (asking) asking.abort(); // a new question ends the previous answer (and its request to the VLM)
  const controller = new AbortController();
  asking = controller;
  const answer = $("answer");
  answer.textContent = "";
  answer.className = "";
  answer.hidden = false;
  $("citations").replaceChildren();
  $("ask").dataset.state = "asking";
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      body: { model: "visioncap-ask", messages: [{ role: "user", content: question }], stream: true },
      signal: controller.signal,
    });
    for await (const block of eventBlocks(response)) {
      const data = eventData(block.split("\n"));
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.visioncap) $("citations").replaceChildren(...chunk.visioncap.citations.map(citationLink));
      answer.textContent += chunk.choices[0].delta.content || "";
    }
    $("ask").dataset.state = "answered";
  } catch (error) {
    if (error.name === "AbortError") return;
    answer.textContent = error.message;
    answer.className = "error";
    $("ask").dataset.state = "failed";
  }
}

// The stream first, the list once the stream has started: a caption stored while both open is then in the list,
// or sent by the stream, or both (its card is replaced, not doubled), never in neither.
export async function refresh() {
  state.started = true;
  const generation = ++state.generation;
  camerasLoadedAt = Date.now();
  loadCameras();
  clearCards();
  state.cursor = null;
  await new Promise((resolve) => follow(false, resolve));
  if (generation === state.generation) loadPage(); // else a newer refresh loads its own list
}

// What the server offers: the words / semantic / hybrid switch only where it ranks by meaning.
export function applyCapabilities() {
  const semantic = session.caps.semantic_search;
  $("mode-field").hidden = !semantic;
  if (!semantic) $("mode").value = "words";
}

export function noKey() {
  status("Enter an API key (visioncap api-key makes one).");
}

export const captionsView = {
  name: "captions",
  title: "Captions",
  enter() {
    // The list is loaded once and then follows live captions; coming back to it keeps where it was.
    if (!state.started && session.key) refresh();
    else if (!session.key) noKey();
  },
  leave() {},
};

export function setUp() {
  $("filters").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
  // Turned back on: the list again (with what came while off), then the stream; turned off: the stream closes.
  $("live").addEventListener("change", () => ($("live").checked ? refresh() : follow()));
  $("askform").addEventListener("submit", (event) => {
    event.preventDefault();
    const question = $("question").value.trim();
    if (question && session.key) askQuestion(question);
  });
  $("mode").addEventListener("change", () => { if ($("q").value.trim()) refresh(); });
  $("more").addEventListener("click", () => loadPage());
  setInterval(() => { if (session.key && state.started && !document.hidden) camerasSoon(); }, CAMERAS_POLL_MS);
}

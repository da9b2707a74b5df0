// The API as the page uses it: the key (kept in this browser, sent as a header), errors as readable sentences,
// what the server and the key can do (/v1/capabilities), and images fetched with the key (an <img src> could
// not send it).

export const session = {
  key: localStorage.getItem("visioncap.key") || "",
  // Until /v1/capabilities answers: the least a server offers (no semantic search, read only).
  caps: { semantic_search: false, max_page_size: 50, scopes: [], cameras: null },
};

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.param = param;
  }
}

export function setKey(key) {
  session.key = key;
  localStorage.setItem("visioncap.key", key);
}

export function authHeaders() {
  return { Authorization: `Bearer ${session.key}` };
}

// The server's message says what was wrong; the lead-in says what it means for the user.
function explained(status, message) {
  switch (status) {
    case 401: return `The API key was not accepted (${message}). Enter a valid key above.`;
    case 403: return `This API key may not do that: ${message}.`;
    case 404: return `Not found: ${message}.`;
    case 409: return `Not done: ${message}.`;
    case 422: return `The server refused the request: ${message}.`;
    case 503: return `The server is busy or its database is unavailable (${message}); try again shortly.`;
    default: return status >= 500 ? `The server failed (HTTP ${status}): ${message}.` : message;
  }
}

export async function readError(response) {
  let message = `HTTP ${response.status}`;
  let param = null;
  try {
    const error = (await response.json()).error;
    message = error.message;
    param = error.param;
  } catch (_) { /* not JSON: the status says enough */ }
  return new ApiError(response.status, explained(response.status, message), param);
}

// `params`: [name, value] pairs, sent only when the value is set (the API refuses parameters a route does not
// declare, so callers pass exactly the route's own).
export async function api(path, { params = [], method = "GET", body, signal, headers = {} } = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of params) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.append(name, value);
  }
  const init = { method, headers: { ...authHeaders(), ...headers }, signal };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "The server cannot be reached; check the connection and try again.", null);
  }
  if (!response.ok) throw await readError(response);
  return response;
}

export async function apiJson(path, options) {
  return (await api(path, options)).json();
}

export function canWrite() {
  return session.caps.scopes.includes("write");
}

export async function loadCapabilities() {
  try {
    session.caps = await apiJson("/v1/capabilities");
  } catch (error) {
    if (error.status !== 404) throw error;
    // A server from before /v1/capabilities: offer only what every server has.
    session.caps = { semantic_search: false, max_page_size: 50, scopes: ["read"], cameras: null };
  }
  return session.caps;
}

// Object URLs of images fetched with the key; the owner revokes them when its view goes (`release`).
export class Images {
  constructor() { this.urls = []; }

  async load(path) {
    const blob = await (await api(path)).blob();
    const url = URL.createObjectURL(blob);
    this.urls.push(url);
    return url;
  }

  async into(img, path, fallbackAlt = "image not available") {
    if (!path) { img.alt = fallbackAlt; return; }
    try {
      img.src = await this.load(path);
    } catch (_) {
      img.alt = fallbackAlt;
    }
  }

  release() {
    for (const url of this.urls) URL.revokeObjectURL(url);
    this.urls = [];
  }
}

// Every page of a search, following `next_cursor` (also past partial pages) up to `maxPages`: the caller learns
// whether more were left.
export async function allCaptions(params, maxPages, signal) {
  const limit = Math.min(200, session.caps.max_page_size || 50);
  const items = [];
  let cursor = null;
  for (let page = 0; page < maxPages; page += 1) {
    const answer = await apiJson("/v1/captions", { params: [...params, ["limit", limit], ["cursor", cursor]], signal });
    items.push(...answer.items);
    cursor = answer.next_cursor;
    if (!cursor) return { items, more: false };
  }
  return { items, more: true };
}

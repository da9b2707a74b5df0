// Small DOM helpers. Every text the server sends (captions are model output) goes in as text, never as markup.

export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...children.flat(Infinity).filter((child) => child !== null && child !== undefined && child !== false));
  return node;
}

export function setStatus(node, text, kind = "") {
  node.textContent = text;
  node.className = `status ${kind}`.trim();
}

export function whenLocal(iso) {
  return new Date(iso).toLocaleString();
}

export function clock(ms, seconds = false) {
  const options = { hour: "2-digit", minute: "2-digit", hour12: false };
  if (seconds) options.second = "2-digit";
  return new Date(ms).toLocaleTimeString([], options);
}

export function timeEl(iso, text = whenLocal(iso)) {
  return h("time", { datetime: iso }, text);
}

export function ago(iso) {
  if (!iso) return "";
  const seconds = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (seconds < 0) return "just now";
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

export function people(count) {
  return `${count} ${count === 1 ? "person" : "people"}`;
}

export function badge(text, kind = text) {
  return h("span", { class: `badge badge-${kind}` }, text);
}

// A watch rule's answer (a decision of /v1/alerts/decisions): match, no match, or none came.
export function answerBadge(decision) {
  if (decision.match === true) return badge("match", "match");
  if (decision.match === false) return badge("no match", "no-match");
  return badge("no answer", "no-answer");
}

// A local day as YYYY-MM-DD (what <input type=date> holds) and back to its start.
export function dayOf(ms) {
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
}

export function dayStart(day) {
  const [y, m, d] = day.split("-").map(Number);
  return new Date(y, m - 1, d).getTime();
}

export function validDay(day) {
  return typeof day === "string" && /^\d{4}-\d{2}-\d{2}$/.test(day) && !Number.isNaN(dayStart(day));
}

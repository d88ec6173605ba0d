// Building the page: elements are made with h() / svg() and text always goes in as text nodes
// (never innerHTML), so a task key, an error message or params cannot become markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

function setProps(el, props) {
  for (const [name, value] of Object.entries(props ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "style" && typeof value === "object") {
      Object.assign(el.style, value); // through the CSSOM: allowed by the page's CSP
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "class" && Array.isArray(value)) {
      el.setAttribute("class", value.filter(Boolean).join(" "));
    } else if (name === "value" && "value" in el) {
      el.value = String(value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

/** An HTML element: h("a", {href: "#/", class: "x"}, "text", child, [more]). */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

/** An SVG element, like h(). */
export function svg(tag, props = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setProps(el, props);
  append(el, children);
  return el;
}

const KNOWN_STATES = new Set([
  "pending", "running", "succeeded", "failed", "expired", "cancelled", // tasks
  "lost", "released", "revoked", "rejected", "snoozed", // attempts
  "active", "suspended", "error", "ended", "awaiting_completion", // plans
  "live", "stopping", "stopped", "stale", // workers
]);

/** A coloured badge; the class only ever comes from the known list. */
export function badge(state) {
  const text = String(state ?? "unknown");
  return h("span", { class: ["badge", KNOWN_STATES.has(text) ? text : null] }, text.replaceAll("_", " "));
}

export function table(headers, rows, emptyText = "Nothing here.") {
  if (rows.length === 0) return h("p", { class: "empty" }, emptyText);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, headers.map((name) => h("th", { class: numeric(name) ? "num" : null }, name)))),
      h("tbody", {}, rows),
    ),
  );
}

function numeric(header) {
  return /^(#|count|runs|running|attempts|finished|succeeded|failed|pending|p50|p95|skip next|failures|failure rate|oldest pending|due|oldest due)$/i.test(
    header,
  );
}

export function panel(title, hint, ...children) {
  return h("section", { class: "panel" }, h("h2", {}, title, hint ? h("span", { class: "hint" }, hint) : null), children);
}

export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(([, value]) => value !== null && value !== undefined && value !== "").map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
  );
}

export function json(value) {
  return h("pre", {}, JSON.stringify(value, null, 2) ?? "null");
}

// -- formatting -----------------------------------------------------------------------------------

const pad = (n, width = 2) => String(n).padStart(width, "0");

/** Local time "2026-11-22 18:03:05"; the element's title has the exact UTC time. */
export function time(iso) {
  if (!iso) return h("span", { class: "hint" }, "—");
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const text = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return h("time", { datetime: iso, title: d.toISOString() }, text);
}

/** "850 ms", "12.4 s", "3 min 20 s", "2 h 5 min", "3 d 4 h". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.abs(seconds);
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** "3 min ago" / "in 2 h 5 min" relative to now. */
export function relative(iso) {
  if (!iso) return "";
  const seconds = (new Date(iso).getTime() - Date.now()) / 1000;
  if (Math.abs(seconds) < 1) return "now";
  return seconds > 0 ? `in ${duration(seconds)}` : `${duration(-seconds)} ago`;
}

export function percent(rate) {
  return rate === null || rate === undefined ? "—" : `${(rate * 100).toFixed(rate < 0.1 && rate > 0 ? 1 : 0)} %`;
}

/** The value of a datetime-local input (local time) as ISO-8601 UTC for the API. */
export function localInputToIso(value) {
  if (!value) return "";
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? "" : d.toISOString();
}

/** An ISO time as a datetime-local input value (local time, minutes). */
export function isoToLocalInput(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/** The link to a task's page (keys may hold any character: encoded in the hash). */
export function taskHref(key) {
  return "#/task/" + encodeURIComponent(key);
}

export function tasksHref(filters) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(filters)) if (value) query.set(name, value);
  const text = query.toString();
  return text ? `#/tasks?${text}` : "#/tasks";
}

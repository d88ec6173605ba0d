// The dashboard's shell: login, the hash router, the banner, the confirmation dialog, the key
// search in the header, and live updates (live.js: the event stream, else polling).
// Pages: #/ (overview), #/tasks?filters, #/task/<key>, #/new (a new task), #/plans, #/workers;
// anything else: not found.

import { api, ApiError, clearToken, getToken, setToken } from "./api.js";
import { h, tasksHref } from "./dom.js";
import { startLive } from "./live.js";
import { overviewPage } from "./pages/overview.js";
import { plansPage } from "./pages/plans.js";
import { sendPage } from "./pages/send.js";
import { taskPage } from "./pages/task.js";
import { tasksPage } from "./pages/tasks.js";
import { workersPage } from "./pages/workers.js";

const REFRESH_GAP_MS = 1000; // live updates redraw at most once a second
const SETTLE_MS = 1500;
const main = document.getElementById("main");
const banner = document.getElementById("banner");
let role = null;
let tokenName = null;
let renderSeq = 0;
let pendingNotice = null;
let stopLive = null;
let refreshTimer = null;
let settleTimer = null;
let refreshing = false;
let refreshAgain = false;
let lastRefresh = 0;

// -- banner -------------------------------------------------------------------------------------

function showError(exc) {
  const text = exc instanceof ApiError ? exc.describe() : String(exc?.message ?? exc);
  banner.className = "banner error";
  banner.textContent = text;
  banner.hidden = false;
}

function showInfo(text) {
  banner.className = "banner info";
  banner.textContent = text;
  banner.hidden = false;
}

function clearBanner() {
  banner.hidden = true;
  banner.textContent = "";
}

// -- confirmation dialog ------------------------------------------------------------------------

/** Ask before a change. fields: [{type: "text"|"checkbox"|"number", name, label, value, min}].
 *  Resolves to the fields' values, or null when the user backs out. */
function confirmAction({ title, text, confirmLabel = "Confirm", fields = [] }) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").replaceChildren(...[text].flat().map((t) => (t instanceof Node ? t : document.createTextNode(String(t)))));
  document.getElementById("confirm-yes").textContent = confirmLabel;
  const box = document.getElementById("confirm-fields");
  const inputs = fields.map((field) => {
    const input = h("input", {
      type: field.type,
      name: field.name,
      value: field.type === "checkbox" ? null : field.value ?? "",
      min: field.min,
      maxlength: field.type === "text" ? 1000 : null,
      id: `confirm-${field.name}`,
    });
    if (field.type === "checkbox") input.checked = Boolean(field.value);
    return { field, input };
  });
  box.replaceChildren(
    ...inputs.map(({ field, input }) =>
      field.type === "checkbox" ? h("label", {}, input, field.label) : h("label", {}, field.label, input),
    ),
  );
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        if (dialog.returnValue !== "ok") return resolve(null);
        const values = {};
        for (const { field, input } of inputs) {
          values[field.name] = field.type === "checkbox" ? input.checked : field.type === "number" ? Number(input.value) : input.value;
        }
        resolve(values);
      },
      { once: true },
    );
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// -- session ------------------------------------------------------------------------------------

function loginPage(message) {
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", placeholder: "API token", required: true });
  const error = h("p", { class: "error-line", id: "login-error" }, message ?? "");
  const form = h(
    "form",
    {
      id: "login",
      onsubmit: async (event) => {
        event.preventDefault();
        setToken(input.value.trim());
        try {
          await start();
        } catch (exc) {
          clearToken();
          error.textContent = exc instanceof ApiError ? exc.describe() : String(exc);
        }
      },
    },
    h("label", { for: "token" }, "API token (admin or read)"),
    input,
    h("button", { type: "submit" }, "Log in"),
    error,
    h("p", { class: "hint" }, "The token stays in this browser tab (sessionStorage) and goes with each request as Authorization: Bearer. A read token shows everything; only an admin token may change tasks, plans and workers."),
  );
  document.getElementById("nav").hidden = true;
  document.getElementById("session").hidden = true;
  main.replaceChildren(h("section", { class: "panel login" }, h("h2", {}, "Log in to mscheduler"), form));
  input.focus();
}

async function start() {
  const me = await api("whoami");
  showRole(me.role, me.name);
  document.getElementById("nav").hidden = false;
  document.getElementById("session").hidden = false;
  document.getElementById("search").hidden = false;
  await render();
  stopLive?.();
  stopLive = startLive({
    onEvent: (event) => {
      if (!wanted(event)) return;
      scheduleRefresh();
      // and once more when the events stop: statistics may be a second old (the API reuses them)
      clearTimeout(settleTimer);
      settleTimer = setTimeout(scheduleRefresh, SETTLE_MS);
    },
    onState: showLive,
    onPoll: () => scheduleRefresh(),
    onUnauthorized: () => logout("The token was refused (unknown or missing): log in again."),
  });
}

function showRole(value, name) {
  role = value;
  tokenName = name ?? tokenName;
  const badge = document.getElementById("role");
  badge.textContent = role === "admin" ? "admin" : `${role} (read-only)`;
  badge.title = tokenName ? `token ${tokenName}` : "";
  badge.className = role === "admin" ? "role admin" : "role";
}

const LIVE_TEXT = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", polling: "polling" };

function showLive(state, detail) {
  const badge = document.getElementById("live");
  badge.textContent = LIVE_TEXT[state] ?? state;
  badge.className = `conn ${state}`;
  badge.dataset.state = state;
  badge.title =
    state === "live"
      ? "updates arrive as they happen (the API's event stream)"
      : state === "polling"
        ? `refreshed every 10 s: ${detail ?? "no event stream"}`
        : "the event stream dropped: reconnecting";
}

function logout(message) {
  stopLive?.();
  stopLive = null;
  clearToken();
  role = null;
  clearBanner();
  document.getElementById("search").hidden = true;
  loginPage(message);
}

// -- live refresh ----------------------------------------------------------------------------------

/** Does the current page show what this event changed? (A task's page: its own events.) */
function wanted(event) {
  const current = route();
  return current.render.wants ? current.render.wants(event, { key: current.key, query: current.query }) : true;
}

/** Redraw the page with fresh data soon: at most once a second however many events arrive,
 *  never while a dialog is open or the user is typing in the page (then a bit later). */
function scheduleRefresh() {
  if (refreshing) {
    refreshAgain = true;
    return;
  }
  if (refreshTimer !== null) return;
  const wait = Math.max(0, lastRefresh + REFRESH_GAP_MS - Date.now());
  refreshTimer = setTimeout(async () => {
    refreshTimer = null;
    const typing = main.contains(document.activeElement) && document.activeElement.matches("input, select, textarea");
    if (role === null || document.getElementById("confirm").open || typing) {
      lastRefresh = Date.now();
      return scheduleRefresh();
    }
    refreshing = true;
    try {
      await refresh();
    } finally {
      refreshing = false;
      lastRefresh = Date.now();
      if (refreshAgain) {
        refreshAgain = false;
        scheduleRefresh();
      }
    }
  }, wait);
}

/** The current page with fresh data, in place: its own update() if it has one (the task list
 *  keeps its selection), else a new render keeping the scroll and the open details. */
async function refresh() {
  const current = route();
  const node = main.firstElementChild;
  if (current.render.update && node && main.dataset.page === current.page) {
    try {
      await current.render.update(context(current), node);
      main.dataset.updated = String(Number(main.dataset.updated ?? 0) + 1);
    } catch (exc) {
      if (exc instanceof ApiError && exc.status === 401) return logout(exc.describe());
    }
    return;
  }
  const open = [...main.querySelectorAll("details[open][data-keep]")].map((d) => d.dataset.keep);
  const y = window.scrollY;
  await render({ keepBanner: true, live: true });
  for (const id of open) main.querySelector(`details[data-keep="${CSS.escape(id)}"]`)?.setAttribute("open", "");
  window.scrollTo(0, y);
  main.dataset.updated = String(Number(main.dataset.updated ?? 0) + 1);
}

// -- routing ------------------------------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, queryText = ""] = hash.split(/\?(.*)/s);
  const query = new URLSearchParams(queryText);
  if (path.startsWith("/task/")) {
    try {
      return { page: "task", render: taskPage, key: decodeURIComponent(path.slice(6)), query };
    } catch {
      return { page: "missing", render: notFoundPage, query };
    }
  }
  if (path === "/tasks") return { page: "tasks", render: tasksPage, query };
  if (path === "/new") return { page: "new", render: sendPage, query };
  if (path === "/plans") return { page: "plans", render: plansPage, query };
  if (path === "/workers") return { page: "workers", render: workersPage, query };
  if (path === "/" || path === "") return { page: "overview", render: overviewPage, query };
  return { page: "missing", render: notFoundPage, query };
}

async function notFoundPage() {
  return h(
    "section",
    { class: "panel", id: "not-found" },
    h("h2", {}, "Not found"),
    h("p", {}, "There is no such page in the dashboard. ", h("a", { href: "#/" }, "Go to the overview"), "."),
  );
}

function context(current) {
  return { role, isAdmin: role === "admin", query: current.query, key: current.key, act, confirm: confirmAction, navigate, showInfo, showError };
}

function navigate(hash, notice) {
  pendingNotice = notice ?? null;
  if (location.hash === hash) render();
  else location.hash = hash;
}

/** Run a change against the API; on success say so and redraw (or go to ``then``, a page's
 *  hash), on refusal show why. */
async function act(call, doneText, { then } = {}) {
  try {
    const result = await call();
    if (then) {
      navigate(then, doneText);
      return result;
    }
    await render({ keepBanner: true });
    showInfo(doneText);
    return result;
  } catch (exc) {
    if (exc instanceof ApiError && exc.status === 401) return logout(exc.describe());
    if (exc instanceof ApiError && exc.status === 403) await refreshRole(); // no more buttons
    showError(exc);
    return undefined;
  }
}

/** Ask the API again what the token may do, and redraw (after a 403: the token changed). */
async function refreshRole() {
  try {
    const me = await api("whoami");
    showRole(me.role, me.name);
    await render({ keepBanner: true });
  } catch {
    // the refusal itself is what the user needs to see
  }
}

/** Draw the current page. ``live``: a redraw with fresh data (main[data-updated] counts them),
 *  given up when the user navigates meanwhile; otherwise a new page (main[data-ready]). */
async function render({ keepBanner = false, live = false } = {}) {
  if (!getToken() || role === null) return;
  const current = route();
  const seq = live ? renderSeq : ++renderSeq;
  if (!live) {
    const section = current.page === "task" || current.page === "new" ? "tasks" : current.page;
    for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === section);
    if (!keepBanner) clearBanner();
    if (pendingNotice) {
      showInfo(pendingNotice);
      pendingNotice = null;
    }
  }
  const ctx = context(current);
  try {
    const node = await current.render(ctx);
    if (seq !== renderSeq) return; // a newer render started meanwhile
    main.replaceChildren(node);
    main.dataset.page = current.page;
    if (!live) main.dataset.ready = String(seq);
  } catch (exc) {
    if (seq !== renderSeq) return;
    if (exc instanceof ApiError && exc.status === 401) return logout(exc.describe());
    if (live) return; // the next update tries again; the page shown stays
    showError(exc);
    main.replaceChildren(h("p", { class: "empty" }, "Could not load this page."));
    main.dataset.ready = String(seq);
  }
}

// -- wiring -------------------------------------------------------------------------------------

window.addEventListener("hashchange", () => render());
document.getElementById("refresh").addEventListener("click", () => render({ keepBanner: true }));
document.getElementById("logout").addEventListener("click", () => logout("Logged out."));
document.getElementById("search").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("search-key");
  const prefix = input.value.trim();
  if (!prefix) return;
  input.blur();
  navigate(tasksHref({ key_prefix: prefix }));
});

if (getToken()) {
  start().catch((exc) => logout(exc instanceof ApiError ? exc.describe() : String(exc)));
} else {
  loginPage();
}

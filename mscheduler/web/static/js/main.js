// The dashboard's shell: login, the hash router, the banner, the confirmation dialog.
// Pages: #/ (overview), #/tasks?filters, #/task/<key>, #/plans, #/workers.

import { api, ApiError, clearToken, getToken, setToken } from "./api.js";
import { h } from "./dom.js";
import { overviewPage } from "./pages/overview.js";
import { plansPage } from "./pages/plans.js";
import { taskPage } from "./pages/task.js";
import { tasksPage } from "./pages/tasks.js";
import { workersPage } from "./pages/workers.js";

const AUTO_KEY = "mscheduler.auto-refresh";
const AUTO_SECONDS = 10;
const main = document.getElementById("main");
const banner = document.getElementById("banner");
let role = null;
let renderSeq = 0;
let pendingNotice = null;

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
  document.getElementById("confirm-text").textContent = text;
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
  showRole((await api("whoami")).role);
  document.getElementById("nav").hidden = false;
  document.getElementById("session").hidden = false;
  await render();
}

function showRole(value) {
  role = value;
  const badge = document.getElementById("role");
  badge.textContent = role === "admin" ? "admin" : `${role} (read-only)`;
  badge.className = role === "admin" ? "role admin" : "role";
}

function logout(message) {
  clearToken();
  role = null;
  clearBanner();
  loginPage(message);
}

// -- routing ------------------------------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, queryText = ""] = hash.split(/\?(.*)/s);
  const query = new URLSearchParams(queryText);
  if (path.startsWith("/task/")) return { page: "tasks", render: taskPage, key: decodeURIComponent(path.slice(6)), query };
  if (path === "/tasks") return { page: "tasks", render: tasksPage, query };
  if (path === "/plans") return { page: "plans", render: plansPage, query };
  if (path === "/workers") return { page: "workers", render: workersPage, query };
  return { page: "overview", render: overviewPage, query };
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
    showRole((await api("whoami")).role);
    await render({ keepBanner: true });
  } catch {
    // the refusal itself is what the user needs to see
  }
}

async function render({ keepBanner = false } = {}) {
  if (!getToken() || role === null) return;
  const current = route();
  const seq = ++renderSeq;
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === current.page);
  if (!keepBanner) clearBanner();
  if (pendingNotice) {
    showInfo(pendingNotice);
    pendingNotice = null;
  }
  const ctx = { role, isAdmin: role === "admin", query: current.query, key: current.key, act, confirm: confirmAction, navigate };
  try {
    const node = await current.render(ctx);
    if (seq !== renderSeq) return; // a newer render started meanwhile
    main.replaceChildren(node);
    main.dataset.page = current.page;
    main.dataset.ready = String(seq);
  } catch (exc) {
    if (seq !== renderSeq) return;
    if (exc instanceof ApiError && exc.status === 401) return logout(exc.describe());
    showError(exc);
    main.replaceChildren(h("p", { class: "empty" }, "Could not load this page."));
    main.dataset.ready = String(seq);
  }
}

// -- wiring -------------------------------------------------------------------------------------

window.addEventListener("hashchange", () => render());
document.getElementById("refresh").addEventListener("click", () => render({ keepBanner: true }));
document.getElementById("logout").addEventListener("click", () => logout("Logged out."));
const auto = document.getElementById("auto-refresh");
auto.checked = sessionStorage.getItem(AUTO_KEY) === "1";
auto.addEventListener("change", () => sessionStorage.setItem(AUTO_KEY, auto.checked ? "1" : "0"));
setInterval(() => {
  const typing = main.contains(document.activeElement) && document.activeElement.matches("input, select");
  if (auto.checked && role !== null && !typing && !document.getElementById("confirm").open) render({ keepBanner: true });
}, AUTO_SECONDS * 1000);

if (getToken()) {
  start().catch((exc) => logout(exc instanceof ApiError ? exc.describe() : String(exc)));
} else {
  loginPage();
}

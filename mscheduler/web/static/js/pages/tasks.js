// The task list: the API's filters (status, name, key prefix, worker, group, created and finished
// ranges), sorting by a column (newest first by default), previous / next pages and a page size,
// all kept in the page's address (a view can be shared). Admins select rows — or every task
// the filter selects — and act on them all at once: the confirmation shows how many, the
// result an outcome per task (done, or refused with the rule); an action over a filter runs
// on the server, page by page, with its progress shown here. Live updates redraw the rows in
// place: the selection stays.

import { api } from "../api.js";
import { badge, h, isoToLocalInput, localInputToIso, panel, taskHref, tasksHref, time } from "../dom.js";
import { bulkActions, bulkActionsForStatus, lastError, shownProgress } from "../rules.js";

const STATUSES = ["pending", "running", "succeeded", "failed", "expired", "cancelled"];
const FILTERS = ["status", "name", "key_prefix", "worker_id", "group", "created_from", "created_to", "finished_from", "finished_to"];
const TIMES = new Set(["created_from", "created_to", "finished_from", "finished_to"]);
const LIMITS = ["25", "50", "100", "200"];
const DEFAULT_LIMIT = "50";
const DEFAULT_SORT = "-created";
const COLUMNS = [
  // [label, sort order or null]
  ["Key", "key"],
  ["Name", "name"],
  ["Status", "status"],
  ["Attempts", "attempts"],
  ["Last error", null],
  ["Last worker", null],
  ["Created", "created"],
  ["Updated", "updated"],
  ["Finished", "finished"],
  ["Progress", null],
];
const SORT_TEXT = {
  "-created": "creation time, newest first",
  created: "creation time, oldest first",
  "-updated": "last change, newest first",
  updated: "last change, oldest first",
  "-finished": "finish time, newest first",
  finished: "finish time, oldest first",
  "-attempts": "attempts, most first",
  attempts: "attempts, fewest first",
  status: "status",
  "-status": "status, Z-A",
  name: "name",
  "-name": "name, Z-A",
  key: "key",
  "-key": "key, Z-A",
};
const VERBS = { cancel: "Cancel", pause: "Pause", resume: "Resume", restart: "Restart", remove: "Remove" };
const DONE = { cancel: "cancelled", pause: "paused", resume: "resumed", restart: "restarted", remove: "removed" };
const BULK_POLL_MS = 400;

// The selection, kept while the filters stay the same (across pages and live updates).
const selection = { scope: null, keys: new Map(), matching: null };
// The last bulk action's result (shown until dismissed, across redraws).
let lastBulk = null;

function filtersOf(query) {
  const filters = {};
  for (const name of FILTERS) if (query.get(name)) filters[name] = query.get(name);
  return filters;
}

function sortOf(query) {
  if (query.get("key_prefix")) return query.get("sort") === "-key" ? "-key" : "key"; // key order only
  if (query.get("sort")) return query.get("sort");
  return query.get("finished_from") || query.get("finished_to") ? "-finished" : DEFAULT_SORT;
}

function viewOf(query) {
  return { ...filtersOf(query), sort: query.get("sort") ?? "", limit: query.get("limit") ?? "" };
}

function filterForm(query) {
  const field = (label, input) => h("label", {}, label, input);
  const text = (name, placeholder) => h("input", { type: "text", name, id: `f-${name}`, value: query.get(name) ?? "", placeholder });
  const when = (name) => h("input", { type: "datetime-local", name, id: `f-${name}`, value: isoToLocalInput(query.get(name)) });
  const status = h(
    "select",
    { name: "status", id: "f-status" },
    h("option", { value: "" }, "any"),
    STATUSES.map((s) => h("option", { value: s, selected: query.get("status") === s }, s)),
  );
  const limit = h(
    "select",
    {
      name: "limit",
      id: "f-limit",
      onchange: () => {
        const view = viewOf(query);
        location.hash = tasksHref({ ...view, limit: limit.value === DEFAULT_LIMIT ? "" : limit.value });
      },
    },
    LIMITS.map((n) => h("option", { value: n, selected: (query.get("limit") ?? DEFAULT_LIMIT) === n }, n)),
  );
  const form = h(
    "form",
    {
      class: "filters",
      id: "task-filters",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(form);
        const filters = {};
        for (const name of FILTERS) {
          const value = String(data.get(name) ?? "").trim();
          filters[name] = TIMES.has(name) ? localInputToIso(value) : value;
        }
        filters.limit = data.get("limit") === DEFAULT_LIMIT ? "" : String(data.get("limit"));
        filters.sort = filters.key_prefix ? "" : query.get("sort") ?? "";
        location.hash = tasksHref(filters);
      },
    },
    field("Status", status),
    field("Name", text("name", "send_invoice")),
    field("Key prefix", text("key_prefix", "invoice-")),
    field("Worker", text("worker_id", "worker id")),
    field("Group", text("group", "gpu")),
    field("Created from", when("created_from")),
    field("Created before", when("created_to")),
    field("Finished from", when("finished_from")),
    field("Finished before", when("finished_to")),
    field("Per page", limit),
    h("div", { class: "buttons" }, h("button", { type: "submit", id: "apply-filters" }, "Filter"), h("a", { href: "#/tasks", class: "hint" }, "clear")),
  );
  return form;
}

function header(query, label, order) {
  const current = sortOf(query);
  if (!order || (query.get("key_prefix") && order !== "key")) return h("th", { class: label === "Attempts" ? "num" : null }, label);
  const active = current.replace(/^-/, "") === order;
  const descending = active && current.startsWith("-");
  // a first click sorts the times and the attempts newest / most first, names and keys A-Z
  const first = ["key", "name", "status"].includes(order) ? order : `-${order}`;
  const next = active ? (descending ? order : `-${order}`) : first;
  const arrow = active ? (descending ? " ▼" : " ▲") : "";
  return h(
    "th",
    { class: [label === "Attempts" ? "num" : null, active ? "sorted" : null], "aria-sort": active ? (descending ? "descending" : "ascending") : null },
    h("a", { href: tasksHref({ ...filtersOf(query), limit: query.get("limit") ?? "", sort: next }), class: "sort", dataset: { sort: order } }, label, arrow),
  );
}

function lastAttempt(task) {
  return task.worker_states.length ? task.worker_states[task.worker_states.length - 1] : null;
}

function row(ctx, task) {
  const last = lastAttempt(task);
  const error = lastError(task);
  const progress = shownProgress(task);
  const box = ctx.isAdmin
    ? h("td", { class: "pick" }, h("input", {
        type: "checkbox",
        class: "pick-row",
        "aria-label": `select ${task.key}`,
        checked: selection.matching !== null || selection.keys.has(task.key),
        disabled: selection.matching !== null,
        onchange: (event) => {
          if (event.target.checked) selection.keys.set(task.key, task);
          else selection.keys.delete(task.key);
          redrawBulkBar(ctx);
        },
      }))
    : null;
  return h(
    "tr",
    { dataset: { key: task.key, status: task.status } },
    box,
    h("td", { class: "key" }, h("a", { href: taskHref(task.key), class: "task-link" }, task.key)),
    h("td", {}, task.name),
    h("td", {}, badge(task.status), task.paused ? [" ", badge("paused")] : null),
    h("td", { class: "num" }, String(task.worker_states.length)),
    h("td", { class: "error-cell" }, error ? h("span", { class: "error-line", title: error }, error) : ""),
    h("td", { class: "key ident" }, last ? last.worker_id : ""),
    h("td", {}, time(task.create_time)),
    h("td", {}, time(task.update_time)),
    h("td", {}, time(task.finish_time)),
    h("td", { class: "num" }, progress === null ? "" : `${Math.round(progress * 100)} %`),
  );
}

function scopeOf(query) {
  return JSON.stringify(filtersOf(query));
}

async function load(query) {
  const params = { ...filtersOf(query), limit: query.get("limit") ?? DEFAULT_LIMIT, cursor: query.get("cursor"), sort: sortOf(query) };
  return api("tasks", { query: params });
}

function listPanel(ctx, page) {
  const query = ctx.query;
  const view = viewOf(query);
  const rows = page.tasks.map((task) => row(ctx, task));
  const pick = ctx.isAdmin
    ? h("th", { class: "pick" }, h("input", {
        type: "checkbox",
        id: "pick-page",
        "aria-label": "select the tasks of this page",
        checked: page.tasks.length > 0 && (selection.matching !== null || page.tasks.every((t) => selection.keys.has(t.key))),
        disabled: selection.matching !== null,
        onchange: (event) => {
          for (const task of page.tasks) {
            if (event.target.checked) selection.keys.set(task.key, task);
            else selection.keys.delete(task.key);
          }
          for (const box of document.querySelectorAll("#tasks .pick-row")) box.checked = event.target.checked;
          redrawBulkBar(ctx);
        },
      }))
    : null;
  const table = page.tasks.length
    ? h("div", { class: "table-wrap" }, h("table", { id: "task-table" }, h("thead", {}, h("tr", {}, pick, COLUMNS.map(([label, order]) => header(query, label, order)))), h("tbody", {}, rows)))
    : h("p", { class: "empty" }, "No task matches these filters.");
  const pager = h(
    "div",
    { class: "pager" },
    page.prev_cursor
      ? h("a", { href: tasksHref({ ...view, cursor: page.prev_cursor }), id: "prev-page", class: "button plain" }, "← Previous")
      : query.get("cursor")
        ? h("a", { href: tasksHref(view), id: "first-page", class: "button plain" }, "← First page")
        : null,
    page.next_cursor
      ? h("a", { href: tasksHref({ ...view, cursor: page.next_cursor }), id: "next-page", class: "button plain" }, "Next →")
      : h("span", { class: "hint" }, "last page"),
  );
  const sort = sortOf(query);
  const order = query.get("key_prefix") ? "in key order" : `sorted by ${SORT_TEXT[sort] ?? sort}`;
  return [h("h2", {}, "Tasks", h("span", { class: "hint", id: "tasks-hint" }, `${page.tasks.length} shown, ${order}`)), table, pager];
}

export async function tasksPage(ctx) {
  const query = ctx.query;
  const scope = scopeOf(query);
  if (selection.scope !== scope) {
    selection.scope = scope;
    selection.keys.clear();
    selection.matching = null;
  }
  const page = await load(query);
  const list = h("section", { class: "panel", id: "task-list" }, listPanel(ctx, page));
  const bulk = ctx.isAdmin ? h("div", { id: "bulk-bar", class: "bulk-bar" }) : null;
  const result = h("div", { id: "bulk-result" });
  // folded on a small screen unless a filter is set (the list comes first there)
  const narrow = window.matchMedia("(max-width: 760px)").matches;
  const filters = h(
    "details",
    { class: "panel filters-box", open: !narrow || Object.keys(filtersOf(query)).length > 0 },
    h("summary", {}, h("h2", {}, "Filters")),
    filterForm(query),
  );
  const start = ctx.isAdmin
    ? h("div", { class: "buttons page-actions" }, h("a", { href: "#/new", class: "button", id: "new-task" }, "New task"))
    : null;
  const node = h("div", { id: "tasks" }, start, filters, bulk, result, list);
  if (ctx.isAdmin) redrawBulkBar(ctx, node, page);
  drawBulkResult(result);
  return node;
}

/** Live updates: the rows again, in place (the filters form and the selection stay). */
tasksPage.update = async (ctx, node) => {
  const page = await load(ctx.query);
  const list = node.querySelector("#task-list");
  if (!list) return;
  list.replaceChildren(...listPanel(ctx, page));
  for (const task of page.tasks) if (selection.keys.has(task.key)) selection.keys.set(task.key, task);
  if (ctx.isAdmin) redrawBulkBar(ctx, node, page);
};

// -- bulk actions -----------------------------------------------------------------------------------

let shownPage = null;

function redrawBulkBar(ctx, node = document, page = shownPage) {
  shownPage = page;
  const bar = node.querySelector("#bulk-bar");
  if (!bar) return;
  const filters = filtersOf(ctx.query);
  const picked = [...selection.keys.values()];
  if (selection.matching !== null) {
    const { count, capped } = selection.matching;
    bar.replaceChildren(
      h("span", { id: "bulk-count" }, `All ${capped ? "≥ " : ""}${count.toLocaleString()} tasks that match this filter are selected.`),
      h("a", { href: "#", id: "bulk-clear", onclick: (e) => (e.preventDefault(), clearSelection(ctx)) }, "clear"),
      h("span", { class: "buttons" }, bulkActionsForStatus(filters.status).map((action) => bulkButton(ctx, action, { filter: filters, count, capped }))),
    );
    bar.hidden = false;
    return;
  }
  const matchAll =
    page && (page.next_cursor || page.prev_cursor || ctx.query.get("cursor"))
      ? h("a", { href: "#", id: "select-matching", onclick: (e) => (e.preventDefault(), selectMatching(ctx)) }, "select all that match this filter")
      : page && page.tasks.length
        ? h("a", { href: "#", id: "select-matching", onclick: (e) => (e.preventDefault(), selectMatching(ctx)) }, "select all that match")
        : null;
  if (!picked.length) {
    bar.replaceChildren(h("span", { class: "hint" }, "Select tasks to act on several at once, or "), matchAll);
    bar.hidden = !page || page.tasks.length === 0;
    return;
  }
  bar.replaceChildren(
    h("span", { id: "bulk-count" }, `${picked.length} selected`),
    h("a", { href: "#", id: "bulk-clear", onclick: (e) => (e.preventDefault(), clearSelection(ctx)) }, "clear"),
    matchAll ? [h("span", { class: "hint" }, "·"), matchAll] : null,
    h("span", { class: "buttons" }, bulkActions(picked).map((action) => bulkButton(ctx, action, { keys: picked.map((t) => t.key) }))),
  );
  bar.hidden = false;
}

function clearSelection(ctx) {
  selection.keys.clear();
  selection.matching = null;
  for (const box of document.querySelectorAll("#tasks .pick-row, #pick-page")) {
    box.checked = false;
    box.disabled = false;
  }
  redrawBulkBar(ctx);
}

async function selectMatching(ctx) {
  try {
    const counted = await api("tasks", { query: { ...filtersOf(ctx.query), limit: 1, with_total: "true" } });
    selection.matching = { count: counted.total, capped: counted.total_capped };
  } catch (exc) {
    return ctx.showError(exc);
  }
  selection.keys.clear();
  for (const box of document.querySelectorAll("#tasks .pick-row, #pick-page")) {
    box.checked = true;
    box.disabled = true;
  }
  redrawBulkBar(ctx);
}

function describeFilter(filters) {
  const parts = Object.entries(filters).map(([k, v]) => `${k.replace("_", " ")} ${TIMES.has(k) ? new Date(v).toLocaleString() : v}`);
  return parts.length ? parts.join(", ") : "no filter: every task";
}

function optionFields(action) {
  if (action === "cancel") return [{ type: "text", name: "reason", label: "Reason", value: "" }];
  if (action === "pause") return [{ type: "checkbox", name: "stop_running", label: "also stop their running attempts (released, not counted against their retries)" }];
  if (action === "restart") return [{ type: "checkbox", name: "force", label: "force: also run succeeded tasks again" }];
  if (action === "remove") return [{ type: "checkbox", name: "force", label: "force: also remove running tasks (cancelled first)" }];
  return [];
}

function bulkButton(ctx, action, target) {
  const danger = action === "cancel" || action === "remove";
  return h(
    "button",
    {
      type: "button",
      class: [danger ? "danger" : "plain", "small"],
      dataset: { bulk: action },
      onclick: async () => {
        const count = target.keys ? target.keys.length : target.count;
        const many = `${target.capped ? "at least " : ""}${count.toLocaleString()} task${count === 1 ? "" : "s"}`;
        const scope = target.keys ? "the selected tasks" : `every task that matches: ${describeFilter(target.filter)} (tasks created from now on are left alone)`;
        const answer = await ctx.confirm({
          title: `${VERBS[action]} ${many}?`,
          text: [h("strong", { id: "confirm-count" }, many), ` — ${scope}. Each is ${DONE[action]} if its status allows; the others are listed with the rule that refused them.`],
          confirmLabel: `${VERBS[action]} ${many}`,
          fields: optionFields(action),
        });
        if (!answer) return;
        await runBulk(ctx, action, target, answer);
      },
    },
    `${VERBS[action]}…`,
  );
}

async function runBulk(ctx, action, target, options) {
  const body = { action, ...options };
  if (target.keys) body.keys = target.keys;
  else body.filter = Object.fromEntries(Object.entries(target.filter).filter(([, v]) => v));
  let answer;
  try {
    answer = await api("bulk", { method: "POST", body });
  } catch (exc) {
    return ctx.showError(exc);
  }
  selection.keys.clear();
  selection.matching = null;
  if (target.keys) {
    lastBulk = { action, state: "done", results: answer.results, done: answer.done, refused: answer.refused, unknown: answer.unknown, processed: answer.results.length, matched: answer.results.length };
    drawBulkResult();
    return ctx.navigate(location.hash, `${VERBS[action]}: ${answer.done} done, ${answer.refused} refused, ${answer.unknown} gone.`);
  }
  lastBulk = { ...answer, action };
  drawBulkResult();
  while (lastBulk && lastBulk.id === answer.id && lastBulk.state === "running") {
    await new Promise((resolve) => setTimeout(resolve, BULK_POLL_MS));
    try {
      const job = await api(`bulk/${encodeURIComponent(answer.id)}`, { query: { results_limit: 1000 } });
      if (lastBulk?.id === answer.id) lastBulk = job;
    } catch (exc) {
      ctx.showError(exc);
      break;
    }
    drawBulkResult();
  }
  if (lastBulk?.id === answer.id) ctx.navigate(location.hash, `${VERBS[action]}: ${lastBulk.done} done, ${lastBulk.refused} refused, ${lastBulk.unknown} gone (${lastBulk.state}).`);
}

function drawBulkResult(box = document.getElementById("bulk-result")) {
  if (!box) return;
  if (!lastBulk) return box.replaceChildren();
  const job = lastBulk;
  const total = job.matched || job.processed || 0;
  const share = total ? Math.min(job.processed / total, 1) : job.state === "running" ? 0 : 1;
  const refusedFirst = [...job.results].sort((a, b) => (a.outcome === "done") - (b.outcome === "done"));
  box.replaceChildren(
    panel(
      `${VERBS[job.action] ?? job.action}: ${job.state === "running" ? "running" : job.state}`,
      `${job.processed.toLocaleString()} of ${total.toLocaleString()}${job.matched_capped ? "+" : ""} — ${job.done} done, ${job.refused} refused, ${job.unknown} gone`,
      h("div", { class: "progress", id: "bulk-progress", dataset: { state: job.state } }, h("span", { style: { width: `${share * 100}%` } })),
      job.error ? h("p", { class: "error-line" }, job.error) : null,
      h(
        "div",
        { class: "buttons" },
        job.state === "running" && job.id
          ? h("button", { type: "button", class: "plain small", id: "bulk-stop", onclick: () => api(`bulk/${encodeURIComponent(job.id)}/stop`, { method: "POST" }).catch(() => undefined) }, "Stop")
          : h("button", { type: "button", class: "plain small", id: "bulk-dismiss", onclick: () => ((lastBulk = null), drawBulkResult()) }, "Dismiss"),
      ),
      refusedFirst.length
        ? h(
            "div",
            { class: "table-wrap scroll-box" },
            h(
              "table",
              { id: "bulk-outcomes" },
              h("thead", {}, h("tr", {}, h("th", {}, "Task"), h("th", {}, "Outcome"), h("th", {}, "Why"))),
              h(
                "tbody",
                {},
                refusedFirst.map((o) =>
                  h(
                    "tr",
                    { dataset: { key: o.key, outcome: o.outcome } },
                    h("td", { class: "key" }, h("a", { href: taskHref(o.key) }, o.key)),
                    h("td", {}, o.outcome === "done" ? badge(DONE[job.action] ?? "done") : o.outcome === "refused" ? badge("refused") : badge("gone")),
                    h("td", {}, o.outcome === "refused" ? `it is ${o.status}: ${o.rule}` : o.outcome === "unknown" ? "no such task any more" : ""),
                  ),
                ),
              ),
            ),
          )
        : null,
      job.results_total > job.results.length ? h("p", { class: "hint" }, `the first ${job.results.length} of ${job.results_total} outcomes`) : null,
    ),
  );
}

// The task list: the API's filters (status, name, key prefix, worker, group, created and finished
// ranges) and its cursor paging. The filters live in the page's address, so a filtered list can
// be bookmarked. A finished range lists by finish time (a key prefix: in key order).

import { api } from "../api.js";
import { badge, h, isoToLocalInput, localInputToIso, panel, table, taskHref, tasksHref, time } from "../dom.js";

const STATUSES = ["pending", "running", "succeeded", "failed", "expired", "cancelled"];
const FILTERS = ["status", "name", "key_prefix", "worker_id", "group", "created_from", "created_to", "finished_from", "finished_to"];
const TIMES = new Set(["created_from", "created_to", "finished_from", "finished_to"]);
const LIMITS = ["25", "50", "100", "200"];

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
    { name: "limit", id: "f-limit" },
    LIMITS.map((n) => h("option", { value: n, selected: (query.get("limit") ?? "50") === n }, n)),
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
        filters.limit = data.get("limit") === "50" ? "" : String(data.get("limit"));
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

function lastAttempt(task) {
  return task.worker_states.length ? task.worker_states[task.worker_states.length - 1] : null;
}

export async function tasksPage(ctx) {
  const query = ctx.query;
  const params = { limit: query.get("limit") ?? "50", cursor: query.get("cursor") };
  for (const name of FILTERS) params[name] = query.get(name);
  const page = await api("tasks", { query: params });
  const rows = page.tasks.map((task) => {
    const last = lastAttempt(task);
    return h(
      "tr",
      { dataset: { status: task.status } },
      h("td", { class: "key" }, h("a", { href: taskHref(task.key), class: "task-link" }, task.key)),
      h("td", {}, task.name),
      h("td", {}, badge(task.status), task.paused ? [" ", badge("paused")] : null),
      h("td", { class: "num" }, String(task.worker_states.length)),
      h("td", { class: "key ident" }, last ? last.worker_id : ""),
      h("td", {}, time(task.create_time)),
      h("td", {}, time(task.update_time)),
      h("td", {}, time(task.finish_time)),
      h("td", {}, task.progress ? `${Math.round(task.progress.fraction * 100)} %` : ""),
    );
  });
  const filters = {};
  for (const name of [...FILTERS, "limit"]) filters[name] = query.get(name) ?? "";
  const paging = h(
    "div",
    { class: "pager" },
    query.get("cursor") ? h("a", { href: tasksHref(filters), id: "first-page" }, "← first page") : null,
    page.next_cursor
      ? h("a", { href: tasksHref({ ...filters, cursor: page.next_cursor }), id: "next-page" }, h("button", { type: "button", tabindex: -1 }, "Next page →"))
      : h("span", { class: "hint" }, "last page"),
  );
  const byFinish = query.get("finished_from") || query.get("finished_to");
  const order = query.get("key_prefix") ? "in key order" : byFinish ? "by finish time" : "oldest first";
  return h(
    "div",
    { id: "tasks" },
    panel("Filters", null, filterForm(query)),
    panel(
      "Tasks",
      `${page.tasks.length} shown, ${order}`,
      table(["Key", "Name", "Status", "Attempts", "Last worker", "Created", "Updated", "Finished", "Progress"], rows, "No task matches these filters."),
      paging,
    ),
  );
}

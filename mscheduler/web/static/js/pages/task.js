// One task: its summary and options, params, progress and checkpoint, the attempt timeline
// (worker, start, duration, status, error and traceback), children, events; admins get the
// actions its status allows (rules.js, the API's rules; each asks first). A task that changed
// meanwhile gets the API's refusal (409, with the rule) in the banner. Live updates redraw it
// when one of its own events arrives.

import { api, ApiError, taskPath } from "../api.js";
import { attemptTimeline, workflowGraph } from "../charts.js";
import { badge, duration, facts, h, json, panel, relative, table, taskHref, tasksHref, time } from "../dom.js";
import { shownProgress, taskActions } from "../rules.js";

const LIVE = new Set(["pending", "running"]);

async function loadEvents(key) {
  try {
    const answer = await api("events", { query: { key, limit: 200 } });
    return { events: Array.isArray(answer) ? answer : answer.events ?? [] };
  } catch (exc) {
    // 409 event_log_off: the store records no events; 404: a server without the events API
    if (exc instanceof ApiError && exc.status === 409) return { unavailable: "the event log is off in this store." };
    if (exc instanceof ApiError && (exc.status === 404 || exc.status === 422)) return { unavailable: exc.describe() };
    throw exc;
  }
}

function actions(ctx, task) {
  if (!ctx.isAdmin) return null;
  const allowed = taskActions(task);
  const run = (_action, call, done) => ctx.act(call, done);
  // data-action: what the button does (a running task's Remove removes with force)
  const button = (label, action, cls, onclick) =>
    allowed.has(action) ? h("button", { type: "button", class: cls, dataset: { action: action.replace("-running", "") }, onclick }, label) : null;
  const key = task.key;
  const buttons = [
    button("Cancel", "cancel", "danger", async () => {
      const answer = await ctx.confirm({
        title: "Cancel this task?",
        text: `${key} ends as cancelled; a running handler stops at its next ping.`,
        confirmLabel: "Cancel task",
        fields: [{ type: "text", name: "reason", label: "Reason", value: "" }],
      });
      if (answer) await run("cancel", () => api(taskPath(key, "/cancel"), { method: "POST", body: { reason: answer.reason } }), `Cancelled ${key}.`);
    }),
    button("Pause", "pause", "plain", async () => {
      const answer = await ctx.confirm({
        title: "Pause this task?",
        text: `${key} is not claimed again until resumed.`,
        confirmLabel: "Pause",
        fields: [{ type: "checkbox", name: "stop_running", label: "also stop its running attempts (released, not counted against its retries)" }],
      });
      if (answer) await run("pause", () => api(taskPath(key, "/pause"), { method: "POST", query: { stop_running: answer.stop_running ? "true" : "" } }), `Paused ${key}.`);
    }),
    button("Resume", "resume", "plain", () => run("resume", () => api(taskPath(key, "/resume"), { method: "POST" }), `Resumed ${key}.`)),
    button("Restart", "restart", "plain", async () => {
      const answer = await ctx.confirm({
        title: "Restart this task?",
        text: `${key} runs again from a new attempt (its checkpoint and progress are cleared). A deadline already past is dropped, unless you give a new one.`,
        confirmLabel: "Restart",
        fields: [{ type: "text", name: "deadline", label: "New deadline (ISO-8601 with offset, e.g. 2030-01-01T12:00:00Z; optional)", value: "" }],
      });
      const query = answer && answer.deadline.trim() ? { deadline: answer.deadline.trim() } : {};
      if (answer) await run("restart", () => api(taskPath(key, "/restart"), { method: "POST", query }), `Restarted ${key}.`);
    }),
    button("Run again", "rerun", "plain", async () => {
      const answer = await ctx.confirm({
        title: "Run this succeeded task again?",
        text: `${key} succeeded; it runs again from a new attempt (restart with force).`,
        confirmLabel: "Run again",
      });
      if (answer) await run("rerun", () => api(taskPath(key, "/restart"), { method: "POST", query: { force: "true" } }), `Restarted ${key}.`);
    }),
    ...["succeeded", "failed"].map((status) =>
      button(`Mark ${status}`, `mark-${status}`, "plain", async () => {
        const answer = await ctx.confirm({
          title: `Set this task ${status} by hand?`,
          text: `${key} becomes ${status} and is not claimed again until restarted; a child's parent follows.`,
          confirmLabel: `Mark ${status}`,
          fields: [{ type: "text", name: "reason", label: "Reason", value: "" }],
        });
        if (answer) await run(`mark-${status}`, () => api(taskPath(key, "/status"), { method: "POST", body: { status, reason: answer.reason } }), `Set ${key} ${status}.`);
      }),
    ),
    ...["remove", "remove-running"].map((action) =>
      button("Remove", action, "danger", async () => {
        const running = action === "remove-running";
        const answer = await ctx.confirm({
          title: "Remove this task?",
          text: `${key} is deleted from the store, with its attempts${running ? "; it is running: it is cancelled first" : ""}. This cannot be undone.`,
          confirmLabel: "Remove",
        });
        if (answer) await ctx.act(() => api(taskPath(key), { method: "DELETE", query: { force: running ? "true" : "" } }), `Removed ${key}.`, { then: "#/tasks" });
      }),
    ),
  ].filter(Boolean);
  return buttons.length ? h("div", { class: "buttons", id: "task-actions" }, buttons) : null;
}

function attemptRows(task) {
  let lastRetry = -1; // the attempt whose retry time the task waits for (the latest one)
  task.worker_states.forEach((a, i) => {
    if (a.retry_at && a.status !== "running" && a.status !== "succeeded") lastRetry = i;
  });
  return task.worker_states.map((a, i) => {
    const end = a.end_time ? Date.parse(a.end_time) : null;
    const took = end !== null ? (end - Date.parse(a.start_time)) / 1000 : null;
    const error = a.error
      ? h(
          "div",
          {},
          h("div", { class: "error-line" }, `${a.error.type}: ${a.error.message}`),
          a.error.traceback ? h("details", {}, h("summary", {}, "traceback"), h("pre", { class: "traceback" }, a.error.traceback)) : null,
        )
      : a.result !== null && a.result !== undefined
        ? h("details", {}, h("summary", {}, "result"), json(a.result))
        : null;
    return h(
      "tr",
      { dataset: { attempt: String(i + 1) } },
      h("td", { class: "num" }, String(i + 1)),
      h("td", { class: "key ident" }, h("a", { href: tasksHref({ worker_id: a.worker_id }) }, a.worker_id), a.host ? h("div", { class: "hint" }, `${a.host}${a.pid ? ` pid ${a.pid}` : ""}`) : null),
      h("td", {}, badge(a.status), a.final ? h("div", { class: "hint" }, "final") : null),
      h("td", {}, time(a.start_time)),
      h("td", { class: "nowrap" }, took === null ? h("span", { class: "hint" }, `running, ${duration((Date.now() - Date.parse(a.start_time)) / 1000)}`) : duration(took)),
      // when it may run again: only while the task may (a finished task is not retried)
      h("td", {}, a.retry_at && LIVE.has(task.status) && i === lastRetry ? time(a.retry_at) : ""),
      h("td", {}, error),
    );
  });
}

export async function taskPage(ctx) {
  const key = ctx.key;
  let task;
  let eventLog;
  let graph = null;
  try {
    [task, eventLog] = await Promise.all([api(taskPath(key)), loadEvents(key)]);
    // a task with children: its steps as a graph (each step's own status, read fresh)
    graph = task.children ? await api(`workflows/${taskPath(key).replace(/^tasks\//, "")}`).catch(() => null) : null;
  } catch (exc) {
    if (!(exc instanceof ApiError && exc.status === 404)) throw exc;
    return h(
      "section",
      { class: "panel", id: "not-found" },
      h("h2", {}, "Not found"),
      h("p", {}, "No task has the key ", h("code", {}, key), " (it may have been removed). ", h("a", { href: "#/tasks" }, "All tasks"), "."),
    );
  }
  const o = task.option;
  const header = h(
    "div",
    { class: "title-row" },
    h(
      "div",
      {},
      h("div", { class: "crumbs" }, h("a", { href: "#/tasks" }, "Tasks"), " / ", h("a", { href: tasksHref({ name: task.name }) }, task.name)),
      h("h1", { id: "task-key" }, task.key),
      h("div", {}, badge(task.status), task.paused ? [" ", badge("paused")] : null, task.blocked ? [" ", badge("blocked")] : null),
    ),
    actions(ctx, task),
  );

  const summary = panel(
    "Summary",
    null,
    facts([
      ["name", task.name],
      ["status", task.status],
      ["created", time(task.create_time)],
      ["updated", time(task.update_time)],
      ["next claim", task.claim_at ? [time(task.claim_at), " ", h("span", { class: "hint" }, relative(task.claim_at))] : null],
      ["finished", task.finish_time ? time(task.finish_time) : null],
      ["attempts", `${task.worker_states.length} (${task.success_cnt} succeeded, ${task.fail_cnt} failed, ${task.running_cnt} running)`],
      ["priority", String(o.priority)],
      ["workers at once", String(o.concurrent_worker_cnt)],
      ["only on workers", o.specific_worker_ids?.length ? o.specific_worker_ids.join(", ") : null],
      ["max retries", o.max_unexpected_retries === null ? "unlimited" : String(o.max_unexpected_retries)],
      ["run at", o.run_at ? time(o.run_at) : null],
      ["parent", task.parent ? h("a", { href: taskHref(task.parent) }, task.parent) : null],
      ["cancelled", task.cancelled ? [time(task.cancelled.time), task.cancelled.reason ? ` — ${task.cancelled.reason}` : ""] : null],
      ["set by hand", task.marked ? `${task.marked.status} by ${task.marked.by}${task.marked.reason ? ` — ${task.marked.reason}` : ""}` : null],
      ["broken", task.broken ? h("span", { class: "error-line" }, `${task.broken.type}: ${task.broken.message}`) : null],
    ]),
    h("details", {}, h("summary", {}, "all options"), json(o)),
  );

  const paramsPanel = h("div", { id: "params" }, panel("Params", null, json(task.params)));

  const long = [];
  if (task.progress) {
    const fraction = shownProgress(task);
    long.push(
      panel(
        "Progress",
        `${Math.round(fraction * 100)} %`,
        h("div", { class: "progress", id: "progress" }, h("span", { style: { width: `${fraction * 100}%` } })),
        task.progress.message ? h("div", {}, task.progress.message) : null,
      ),
    );
  }
  if (task.checkpoint) {
    const c = task.checkpoint;
    long.push(
      panel(
        "Checkpoint",
        "the next attempt starts from it",
        facts([["saved", time(c.time)], ["by", `${c.worker_id}, attempt ${c.attempt}, save #${c.seq}`]]),
        json(c.data),
      ),
    );
  }

  const attempts = panel(
    "Attempts",
    `${task.worker_states.length}`,
    attemptTimeline(task.worker_states),
    table(["#", "Worker", "Status", "Started", "Took", "Retry at", "Error / result"], attemptRows(task), "Not attempted yet."),
  );

  const modes = { parallel: "all at once", sequential: "in order", graph: "each once what it needs has succeeded" };
  const children = task.children
    ? panel(
        task.children_mode === "graph" ? "Workflow" : "Children",
        task.children_mode ? `run ${modes[task.children_mode] ?? task.children_mode}` : null,
        graph ? workflowGraph(graph, taskHref) : null,
        table(
          ["Child", "Key", "Status"],
          task.children.map((c) => h("tr", {}, h("td", {}, c.name), h("td", { class: "key" }, h("a", { href: taskHref(c.key) }, c.key)), h("td", {}, badge(c.status)))),
        ),
      )
    : null;

  const events = eventLog.unavailable
    ? panel("Events", null, h("p", { class: "hint" }, "The event log cannot be read here: ", eventLog.unavailable))
    : panel(
        "Events",
        eventLog.events.length ? `${eventLog.events.length}` : "none recorded (is the event log on?)",
        table(
          ["Time", "Event", "Worker", "Attempt", "Detail"],
          eventLog.events.map((e) =>
            h(
              "tr",
              {},
              h("td", {}, time(e.time)),
              h("td", {}, badge(e.kind)),
              h("td", { class: "key ident" }, e.worker_id ?? ""),
              h("td", { class: "num" }, e.attempt === null || e.attempt === undefined ? "" : String(e.attempt)),
              h("td", {}, e.detail && Object.keys(e.detail).length ? h("code", {}, JSON.stringify(e.detail)) : ""),
            ),
          ),
          "No events recorded for this task.",
        ),
      );

  return h(
    "div",
    { id: "task" },
    header,
    h("div", { class: "grid two" }, summary, h("div", {}, paramsPanel, long)),
    attempts,
    children,
    events,
  );
}

/** Live updates: this page changes only with the task's own events. */
taskPage.wants = (event, where) => event.key === where.key;

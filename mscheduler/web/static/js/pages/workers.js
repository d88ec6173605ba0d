// Workers: what each runs against its concurrency, when it was last seen (a stale one — no
// heartbeat for a while — is marked), its running tasks (opened on demand); admins may ask a
// live one to stop (it finishes its running tasks first, at its next heartbeat).

import { api } from "../api.js";
import { badge, duration, h, panel, relative, table, taskHref, tasksHref, time } from "../dom.js";

/** live / stopping / stopped / stale, from the API's fields. */
export function workerState(w) {
  if (w.stop_time) return "stopped";
  if (w.stop_requested) return "stopping";
  return w.live ? "live" : "stale";
}

/** The worker's running tasks, loaded when its row's details open. */
function runningTasks(w) {
  const box = h("div", { class: "running-tasks", dataset: { worker: w.worker_id } }, h("span", { class: "hint" }, "loading…"));
  const details = h(
    "details",
    {
      dataset: { keep: `running:${w.worker_id}` },
      ontoggle: async () => {
        if (!details.open) return;
        try {
          const page = await api("tasks", { query: { worker_id: w.worker_id, status: "running", limit: 50, sort: "-updated" } });
          const mine = page.tasks.filter((t) => t.worker_states.some((a) => a.worker_id === w.worker_id && a.status === "running"));
          box.replaceChildren(
            mine.length
              ? h(
                  "ul",
                  { class: "plain-list" },
                  mine.map((t) => {
                    const attempt = [...t.worker_states].reverse().find((a) => a.worker_id === w.worker_id && a.status === "running");
                    return h(
                      "li",
                      { dataset: { key: t.key } },
                      h("a", { href: taskHref(t.key), class: "mono" }, t.key),
                      " ",
                      h("span", { class: "hint" }, t.name, attempt ? ` · for ${duration((Date.now() - Date.parse(attempt.start_time)) / 1000)}` : ""),
                    );
                  }),
                  page.next_cursor ? h("li", {}, h("a", { href: tasksHref({ worker_id: w.worker_id, status: "running" }) }, "all of them →")) : null,
                )
              : h("span", { class: "hint" }, "none running now"),
          );
        } catch (exc) {
          box.replaceChildren(h("span", { class: "error-line" }, String(exc.describe?.() ?? exc)));
        }
      },
    },
    h("summary", {}, `${w.running_cnt} running`),
    box,
  );
  return details;
}

export async function workersPage(ctx) {
  const workers = await api("workers");
  const rows = workers.map((w) => {
    const share = w.concurrency ? Math.min(w.running_cnt / w.concurrency, 1) : 0;
    const state = workerState(w);
    const stop =
      ctx.isAdmin && !w.stop_time && !w.stop_requested
        ? h(
            "button",
            {
              type: "button",
              class: "danger small",
              dataset: { action: "stop" },
              onclick: async () => {
                const ok = await ctx.confirm({
                  title: "Stop this worker?",
                  text: `Worker ${w.worker_id} on ${w.host} stops taking tasks at its next heartbeat and exits once its ${w.running_cnt} running task(s) end.`,
                  confirmLabel: "Stop worker",
                });
                if (ok) await ctx.act(() => api(`workers/${encodeURIComponent(w.worker_id)}/stop`, { method: "POST" }), `Stop requested for ${w.worker_id}.`);
              },
            },
            "Stop",
          )
        : null;
    return h(
      "tr",
      { class: state === "stale" ? "stale" : null, dataset: { worker: w.worker_id, state } },
      h("td", { class: "key ident" }, h("a", { href: tasksHref({ worker_id: w.worker_id }), title: "tasks this worker attempted" }, w.worker_id)),
      h("td", { class: "nowrap" }, w.host, h("span", { class: "hint" }, ` pid ${w.pid}`)),
      h(
        "td",
        {},
        w.names.length ? w.names.join(", ") : h("span", { class: "hint" }, "—"),
        (w.groups || []).length ? h("div", { class: "hint", dataset: { groups: "" } }, `groups: ${w.groups.join(", ")}`) : null,
      ),
      h("td", { class: "num" }, h("span", { class: "meter" }, h("span", { style: { width: `${share * 100}%` } })), `${w.running_cnt} / ${w.concurrency}`),
      h("td", {}, w.stop_time ? h("span", { class: "hint" }, "—") : runningTasks(w)),
      h("td", {}, time(w.start_time)),
      h("td", {}, time(w.last_seen), h("div", { class: state === "stale" ? "error-line" : "hint" }, state === "stale" ? `no heartbeat for ${relative(w.last_seen).replace(" ago", "")}` : relative(w.last_seen))),
      h("td", {}, badge(state), w.stop_time ? h("div", { class: "hint" }, "stopped ", relative(w.stop_time)) : null),
      h("td", { class: "actions" }, stop),
    );
  });
  const stale = workers.filter((w) => workerState(w) === "stale").length;
  return h(
    "div",
    { id: "workers" },
    panel(
      "Workers",
      `${workers.length} registered${stale ? `, ${stale} stale (no recent heartbeat: crashed or cut off?)` : ""}`,
      table(["Worker", "Host", "Handles", "Running", "Tasks", "Started", "Last seen", "State", ""], rows, "No worker registered."),
    ),
  );
}

/** Live updates: workers' running counts change with their attempts' events. */
workersPage.wants = (event) => Boolean(event.worker_id);

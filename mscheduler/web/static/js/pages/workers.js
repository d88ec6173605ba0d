// Workers: what each runs against its concurrency, when it was last seen; admins may ask one
// to stop (it finishes its running tasks first, at its next heartbeat).

import { api } from "../api.js";
import { badge, h, panel, relative, table, tasksHref, time } from "../dom.js";

/** live / stopping / stopped / stale, from the API's fields. */
export function workerState(w) {
  if (w.stop_time) return "stopped";
  if (w.stop_requested) return "stopping";
  return w.live ? "live" : "stale";
}

export async function workersPage(ctx) {
  const workers = await api("workers");
  const rows = workers.map((w) => {
    const share = w.concurrency ? Math.min(w.running_cnt / w.concurrency, 1) : 0;
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
      { dataset: { worker: w.worker_id } },
      h("td", { class: "key ident" }, h("a", { href: tasksHref({ worker_id: w.worker_id }), title: "tasks this worker attempted" }, w.worker_id)),
      h("td", { class: "nowrap" }, w.host, h("span", { class: "hint" }, ` pid ${w.pid}`)),
      h(
        "td",
        {},
        w.names.length ? w.names.join(", ") : h("span", { class: "hint" }, "—"),
        (w.groups || []).length ? h("div", { class: "hint", dataset: { groups: "" } }, `groups: ${w.groups.join(", ")}`) : null,
      ),
      h("td", { class: "num" }, h("span", { class: "meter" }, h("span", { style: { width: `${share * 100}%` } })), `${w.running_cnt} / ${w.concurrency}`),
      h("td", {}, time(w.start_time)),
      h("td", {}, time(w.last_seen), h("div", { class: "hint" }, relative(w.last_seen))),
      h("td", {}, badge(workerState(w)), w.stop_time ? h("div", { class: "hint" }, "stopped ", relative(w.stop_time)) : null),
      h("td", { class: "actions" }, stop),
    );
  });
  return h(
    "div",
    { id: "workers" },
    panel(
      "Workers",
      `${workers.length} registered`,
      table(["Worker", "Host", "Handles", "Running", "Started", "Last seen", "State", ""], rows, "No worker registered."),
    ),
  );
}

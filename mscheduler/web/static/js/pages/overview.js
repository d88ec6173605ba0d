// Overview: counts by status, the last hour's throughput and failure rate, the oldest pending
// task, per-name figures, the waits per fairness key and the workers. Data: GET /stats,
// GET /stats/keys and GET /workers.

import { api } from "../api.js";
import { failureRateChart, throughputChart } from "../charts.js";
import { badge, duration, h, panel, percent, relative, table, tasksHref, time } from "../dom.js";
import { workerState } from "./workers.js";

const STATUSES = ["pending", "running", "succeeded", "failed", "expired", "cancelled"];

function figure(label, value, id) {
  return h("div", { class: "figure", id }, h("div", { class: "v" }, value), h("div", { class: "k" }, label));
}

export async function overviewPage() {
  const [stats, workers, keyWaits] = await Promise.all([api("stats"), api("workers"), api("stats/keys")]);
  const d = stats.details;
  const failureRate = d.finished ? d.failed / d.finished : null;
  const oldest = d.names
    .filter((n) => n.oldest_pending_age !== null)
    .sort((a, b) => b.oldest_pending_age - a.oldest_pending_age)[0];

  const cards = h(
    "div",
    { class: "cards", id: "status-counts" },
    STATUSES.map((status) =>
      h(
        "a",
        { class: ["card", status], href: tasksHref({ status }), dataset: { status } },
        h("div", { class: "n" }, String(stats.counts[status] ?? 0)),
        h("div", { class: "label" }, status),
      ),
    ),
    h("a", { class: "card", href: "#/tasks" }, h("div", { class: "n" }, String(stats.total)), h("div", { class: "label" }, "all tasks")),
  );

  const hour = panel(
    "Last hour",
    ["tasks that finished (succeeded or failed) since ", time(new Date(Date.parse(d.now) - d.window_seconds * 1000).toISOString())],
    h(
      "div",
      { class: "figures" },
      figure("finished", String(d.finished)),
      figure("failed", String(d.failed)),
      figure("failure rate", percent(failureRate), "failure-rate"),
      figure("first-attempt success", percent(d.first_attempt_success_rate)),
      figure("second-attempt success", percent(d.second_attempt_success_rate)),
      figure(
        "oldest pending (due, waiting)",
        oldest ? `${duration(oldest.oldest_pending_age)} · ${oldest.name}` : "none waiting",
        "oldest-pending",
      ),
    ),
    h("div", { class: "grid two" }, h("div", {}, h("h2", {}, "Throughput"), throughputChart(d.throughput)), h("div", {}, h("h2", {}, "Failure rate"), failureRateChart(d.throughput))),
  );

  const byName = panel(
    "By task name",
    "durations of the succeeded attempts in the last hour",
    table(
      ["Name", "Pending", "Running", "Succeeded", "Failed", "Finished", "Failure rate", "p50", "p95", "Oldest pending"],
      d.names.map((n) =>
        h(
          "tr",
          {},
          h("td", {}, h("a", { href: tasksHref({ name: n.name }) }, n.name)),
          ["pending", "running", "succeeded", "failed"].map((s) => h("td", { class: "num" }, String(n.counts[s] ?? 0))),
          h("td", { class: "num" }, String(n.finished)),
          h("td", { class: "num" }, percent(n.finished ? n.failed / n.finished : null)),
          h("td", { class: "num" }, duration(n.duration_p50)),
          h("td", { class: "num" }, duration(n.duration_p95)),
          h("td", { class: "num" }, n.oldest_pending_age === null ? "—" : duration(n.oldest_pending_age)),
        ),
      ),
      "No tasks yet.",
    ),
  );

  const byKey = h(
    "div",
    { id: "by-key" },
    panel(
      "By fairness key",
      "due tasks per key (a tenant), the longest wait first",
      table(
        ["Key", "Due", "Oldest due"],
        keyWaits.keys.map((k) =>
          h(
            "tr",
            { dataset: { key: k.key } },
            h("td", { class: "key ident" }, k.key),
            h("td", { class: "num" }, String(k.due)),
            h("td", { class: "num" }, duration(k.oldest_wait)),
          ),
        ),
        "No due task has a fairness key.",
      ),
    ),
  );

  const workerPanel = panel(
    "Workers",
    h("a", { href: "#/workers" }, "all workers →"),
    table(
      ["Worker", "Host", "Running", "Last seen", "State"],
      workers.map((w) =>
        h(
          "tr",
          {},
          h("td", { class: "key ident" }, h("a", { href: tasksHref({ worker_id: w.worker_id }) }, w.worker_id)),
          h("td", {}, w.host),
          h("td", { class: "num" }, `${w.running_cnt} / ${w.concurrency}`),
          h("td", {}, time(w.last_seen), " ", h("span", { class: "hint" }, relative(w.last_seen))),
          h("td", {}, badge(workerState(w))),
        ),
      ),
      "No worker registered.",
    ),
  );

  return h("div", { id: "overview" }, cards, hour, byName, byKey, workerPanel);
}

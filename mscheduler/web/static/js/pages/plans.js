// Plans: state, schedule, the next five fire times (the schedule's arithmetic, from the API),
// the last run and, opened on demand, the last runs with their outcome; admins may suspend,
// resume, skip the next occurrences or run one now — the buttons its state allows.

import { api } from "../api.js";
import { badge, h, panel, relative, table, taskHref, tasksHref, time } from "../dom.js";

const RUNS_SHOWN = 5;

/** "every PT1H", "cron 0 9 * * 1-5", "weekly ..." and the time zone, from the timing's fields. */
function scheduleText(timing) {
  const s = timing.schedule ?? {};
  const rest = Object.entries(s)
    .filter(([name, value]) => name !== "kind" && value !== null && value !== undefined)
    .map(([name, value]) => (typeof value === "object" ? `${name}=${JSON.stringify(value)}` : name === "expression" || name === "interval" ? String(value) : `${name}=${value}`));
  return [s.kind ?? "?", ...rest].join(" ") + (timing.tz ? ` (${timing.tz})` : "");
}

function planActions(ctx, plan) {
  if (!ctx.isAdmin) return null;
  const id = encodeURIComponent(plan.plan_id);
  const buttons = [];
  if (plan.state === "suspended" || plan.state === "error") {
    buttons.push(
      h("button", { type: "button", class: "small", dataset: { action: "resume" }, onclick: () => ctx.act(() => api(`plans/${id}/resume`, { method: "POST" }), `Resumed plan ${plan.plan_id}.`) }, "Resume"),
    );
  } else if (plan.state !== "ended") {
    buttons.push(
      h(
        "button",
        {
          type: "button",
          class: "plain small",
          dataset: { action: "suspend" },
          onclick: async () => {
            const ok = await ctx.confirm({ title: "Suspend this plan?", text: `Plan ${plan.plan_id} makes no run until it is resumed.`, confirmLabel: "Suspend" });
            if (ok) await ctx.act(() => api(`plans/${id}/suspend`, { method: "POST" }), `Suspended plan ${plan.plan_id}.`);
          },
        },
        "Suspend",
      ),
    );
  }
  buttons.push(
    h(
      "button",
      {
        type: "button",
        class: "plain small",
        dataset: { action: "run-now" },
        onclick: async () => {
          const ok = await ctx.confirm({
            title: "Run this plan now?",
            text: `Plan ${plan.plan_id} makes one ${plan.name} task now, outside its schedule (its next fire time and counters stay).`,
            confirmLabel: "Run now",
          });
          if (ok) await ctx.act(() => api(`plans/${id}/run`, { method: "POST" }), `Plan ${plan.plan_id}: a run was made now.`);
        },
      },
      "Run now",
    ),
  );
  if (plan.state !== "ended") {
    buttons.push(
      h(
        "button",
        {
          type: "button",
          class: "plain small",
          dataset: { action: "skip" },
          onclick: async () => {
            const answer = await ctx.confirm({
              title: "Skip occurrences?",
              text: `Plan ${plan.plan_id} passes over its next occurrences (0 cancels earlier skips).`,
              confirmLabel: "Skip",
              fields: [{ type: "number", name: "n", label: "How many", value: Math.max(plan.skip_next, 1), min: 0 }],
            });
            if (answer) await ctx.act(() => api(`plans/${id}/skip`, { method: "POST", query: { n: answer.n } }), `Plan ${plan.plan_id} skips its next ${answer.n}.`);
          },
        },
        "Skip…",
      ),
    );
  }
  return h("div", { class: "buttons" }, buttons);
}

/** The next fire times; the first ``skip_next`` of them are passed over. */
function upcoming(plan) {
  const times = plan.upcoming ?? [];
  if (!times.length) return h("span", { class: "hint" }, "none");
  return h(
    "ol",
    { class: "plain-list upcoming", dataset: { upcoming: plan.plan_id } },
    times.map((t, i) =>
      h("li", { class: i < plan.skip_next ? "skipped" : null, title: i < plan.skip_next ? "skipped" : null }, time(t), i === 0 ? [" ", h("span", { class: "hint" }, relative(t))] : null),
    ),
  );
}

/** The plan's last runs (newest first: its runs' keys sort by fire time), loaded on demand. */
function lastRuns(plan) {
  const box = h("div", {}, h("span", { class: "hint" }, "loading…"));
  const details = h(
    "details",
    {
      dataset: { keep: `runs:${plan.plan_id}` },
      ontoggle: async () => {
        if (!details.open) return;
        try {
          const prefix = `plan:${plan.plan_id}:`;
          const page = await api("tasks", { query: { key_prefix: prefix, sort: "-key", limit: RUNS_SHOWN } });
          box.replaceChildren(
            page.tasks.length
              ? h(
                  "ul",
                  { class: "plain-list", dataset: { runs: plan.plan_id } },
                  page.tasks.map((t) => h("li", {}, h("a", { href: taskHref(t.key), class: "mono" }, time(t.create_time)), " ", badge(t.status))),
                  page.next_cursor ? h("li", {}, h("a", { href: tasksHref({ key_prefix: prefix, sort: "-key" }) }, "all runs →")) : null,
                )
              : h("span", { class: "hint" }, "no run yet"),
          );
        } catch (exc) {
          box.replaceChildren(h("span", { class: "error-line" }, String(exc.describe?.() ?? exc)));
        }
      },
    },
    h("summary", {}, "last runs"),
    box,
  );
  return details;
}

export async function plansPage(ctx) {
  const plans = await api("plans", { query: { limit: 1000 } });
  const rows = plans.map((p) =>
    h(
      "tr",
      { dataset: { plan: p.plan_id } },
      h("td", { class: "key" }, p.plan_id),
      h("td", {}, h("a", { href: tasksHref({ name: p.name }) }, p.name)),
      h("td", {}, badge(p.state)),
      h("td", { class: "mono" }, scheduleText(p.timing)),
      h("td", {}, upcoming(p)),
      h(
        "td",
        {},
        p.last_run_key ? [h("a", { href: taskHref(p.last_run_key), class: "mono" }, p.last_run_fire_time ? time(p.last_run_fire_time) : p.last_run_key), " ", p.last_run_status ? badge(p.last_run_status) : null] : h("span", { class: "hint" }, "none yet"),
        lastRuns(p),
      ),
      h("td", { class: "num" }, String(p.runs_made)),
      h("td", { class: "num" }, String(p.skip_next)),
      h("td", { class: "num" }, `${p.consecutive_failures} / ${p.max_consecutive_failures}`),
      h("td", { class: "actions" }, planActions(ctx, p)),
    ),
  );
  return h(
    "div",
    { id: "plans" },
    panel(
      "Plans",
      `${plans.length}`,
      table(["Plan", "Task name", "State", "Schedule", "Next fire times", "Last run", "Runs", "Skip next", "Failures", ""], rows, "No plan yet."),
    ),
  );
}

/** Live updates: a plan's page changes with its runs' events. */
plansPage.wants = (event) => Boolean(event.plan_id);

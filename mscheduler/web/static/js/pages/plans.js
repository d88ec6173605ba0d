// Plans: state, schedule, next fire time, the last run; admins may suspend, resume or skip.

import { api } from "../api.js";
import { badge, h, panel, relative, table, taskHref, tasksHref, time } from "../dom.js";

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
      h("td", {}, p.next_fire_time ? [time(p.next_fire_time), h("div", { class: "hint" }, relative(p.next_fire_time))] : h("span", { class: "hint" }, "none")),
      h(
        "td",
        {},
        p.last_run_key ? [h("a", { href: taskHref(p.last_run_key), class: "mono" }, p.last_run_fire_time ? time(p.last_run_fire_time) : p.last_run_key), " ", p.last_run_status ? badge(p.last_run_status) : null] : h("span", { class: "hint" }, "none yet"),
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
      table(["Plan", "Task name", "State", "Schedule", "Next fire", "Last run", "Runs", "Skip next", "Failures", ""], rows, "No plan yet."),
    ),
  );
}

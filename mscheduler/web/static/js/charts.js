// Small hand-drawn SVG charts: no chart library, nothing loaded from elsewhere.

import { duration, h, svg } from "./dom.js";

const W = 640;
const H = 170;
const PAD = { left: 38, right: 8, top: 10, bottom: 22 };

function niceMax(value) {
  if (value <= 4) return 4;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function minuteLabel(iso) {
  const d = new Date(iso);
  return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
}

function frame(yMax, yFormat, buckets) {
  const innerH = H - PAD.top - PAD.bottom;
  const parts = [];
  for (const f of [0, 0.5, 1]) {
    const y = PAD.top + innerH * (1 - f);
    parts.push(svg("line", { class: "axis", x1: PAD.left, x2: W - PAD.right, y1: y, y2: y }));
    parts.push(svg("text", { x: PAD.left - 4, y: y + 3, "text-anchor": "end" }, yFormat(yMax * f)));
  }
  const step = (W - PAD.left - PAD.right) / Math.max(buckets.length, 1);
  buckets.forEach((bucket, i) => {
    const last = i === buckets.length - 1;
    if (i % 15 === 0 || last) {
      const anchor = last ? "end" : i === 0 ? "start" : "middle";
      parts.push(svg("text", { x: PAD.left + step * (last ? i + 1 : i + 0.5), y: H - 6, "text-anchor": anchor }, minuteLabel(bucket.start)));
    }
  });
  return { parts, step, innerH };
}

/** Tasks finished per minute over the last hour: succeeded and failed stacked. */
export function throughputChart(buckets) {
  const top = niceMax(Math.max(0, ...buckets.map((b) => b.succeeded + b.failed)));
  const { parts, step, innerH } = frame(top, (v) => String(Math.round(v)), buckets);
  buckets.forEach((b, i) => {
    const x = PAD.left + step * i + step * 0.15;
    const width = step * 0.7;
    const okH = (b.succeeded / top) * innerH;
    const badH = (b.failed / top) * innerH;
    const base = PAD.top + innerH;
    const tip = svg("title", {}, `${minuteLabel(b.start)}: ${b.succeeded} succeeded, ${b.failed} failed`);
    if (okH > 0) parts.push(svg("rect", { class: "ok", x, width, y: base - okH, height: okH }, tip.cloneNode(true)));
    if (badH > 0) parts.push(svg("rect", { class: "bad", x, width, y: base - okH - badH, height: badH }, tip));
  });
  return h(
    "figure",
    { class: "chart-box" },
    svg("svg", { class: "chart", id: "throughput-chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "tasks finished per minute" }, parts),
    h("div", { class: "legend" }, h("span", {}, h("i", { class: "ok" }), "succeeded"), h("span", {}, h("i", { class: "bad" }), "failed"), h("span", {}, "per minute, last hour")),
  );
}

/** Share of the finished tasks that failed, per minute (minutes with none finished: no point). */
export function failureRateChart(buckets) {
  const { parts, step, innerH } = frame(1, (v) => `${Math.round(v * 100)}%`, buckets);
  let path = "";
  let pen = "M";
  buckets.forEach((b, i) => {
    const done = b.succeeded + b.failed;
    if (done === 0) {
      pen = "M";
      return;
    }
    const rate = b.failed / done;
    const x = PAD.left + step * (i + 0.5);
    const y = PAD.top + innerH * (1 - rate);
    path += `${pen}${x.toFixed(1)},${y.toFixed(1)} `;
    pen = "L";
    parts.push(svg("circle", { class: "dot", cx: x, cy: y, r: 2.2 }, svg("title", {}, `${minuteLabel(b.start)}: ${Math.round(rate * 100)}% of ${done} failed`)));
  });
  if (path) parts.unshift(svg("path", { class: "rate", d: path }));
  return h(
    "figure",
    { class: "chart-box" },
    svg("svg", { class: "chart", id: "failure-chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "failure rate per minute" }, parts),
    h("div", { class: "legend" }, h("span", {}, h("i", { class: "bad" }), "failed ÷ finished"), h("span", {}, "per minute, last hour")),
  );
}

/** The attempts on one time axis: a row per attempt, a bar from start to end (or now). */
export function attemptTimeline(attempts, nowIso) {
  if (attempts.length === 0) return null;
  const now = new Date(nowIso ?? Date.now()).getTime();
  const spans = attempts.map((a) => {
    const start = new Date(a.start_time).getTime();
    const end = a.end_time ? new Date(a.end_time).getTime() : Math.max(now, start);
    return { a, start, end };
  });
  const t0 = Math.min(...spans.map((s) => s.start));
  const t1 = Math.max(...spans.map((s) => s.end), t0 + 1);
  const rowH = 22;
  const left = 170;
  const width = 1100;
  const plotW = width - left - 12;
  const height = spans.length * rowH + 24;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * plotW;
  const parts = [];
  spans.forEach(({ a, start, end }, i) => {
    const y = i * rowH + 4;
    const label = `#${i + 1} ${a.worker_id}`;
    parts.push(svg("text", { x: 4, y: y + 13 }, label.length > 24 ? label.slice(0, 23) + "…" : label));
    const barX = x(start);
    const barW = Math.max(x(end) - barX, 2);
    parts.push(
      svg(
        "rect",
        { class: ["bar", a.status], x: barX, y, width: barW, height: rowH - 8, rx: 3 },
        svg("title", {}, `${a.worker_id}: ${a.status}, ${duration((end - start) / 1000)}`),
      ),
    );
  });
  const base = spans.length * rowH + 14;
  parts.push(svg("text", { class: "axis-label", x: left, y: base }, "+0"));
  parts.push(svg("text", { class: "axis-label", x: left + plotW, y: base, "text-anchor": "end" }, `+${duration((t1 - t0) / 1000)}`));
  return svg("svg", { class: ["chart", "timeline"], id: "attempt-timeline", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "attempts over time" }, parts);
}

/** A workflow's steps as a graph (GET /workflows/{key}): a column per depth (a step sits right
 * of everything it needs), an arrow per need, each step a box coloured by its status that links
 * to the step's task; a map step's box counts its items by status. */
export function workflowGraph(graph, hrefOf) {
  const depth = new Map();
  for (const step of graph.steps) {
    // the steps come in an order where each follows what it needs (a DAG, checked at send)
    const needs = [...step.needs, ...(step.map_over && !step.needs.includes(step.map_over) ? [step.map_over] : [])];
    depth.set(step.name, needs.length ? Math.max(...needs.map((n) => (depth.get(n) ?? 0) + 1)) : 0);
  }
  const boxW = 170;
  const boxH = 46;
  const gapX = 60;
  const gapY = 18;
  const rows = new Map();
  const at = new Map();
  for (const step of graph.steps) {
    const d = depth.get(step.name);
    const row = rows.get(d) ?? 0;
    rows.set(d, row + 1);
    at.set(step.name, { x: 8 + d * (boxW + gapX), y: 8 + row * (boxH + gapY) });
  }
  const width = 16 + (Math.max(...depth.values()) + 1) * (boxW + gapX) - gapX;
  const height = 16 + Math.max(...rows.values()) * (boxH + gapY) - gapY;
  const parts = [
    svg("defs", {}, svg("marker", { id: "wf-arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }))),
  ];
  for (const step of graph.steps) {
    const to = at.get(step.name);
    const needs = [...step.needs, ...(step.map_over && !step.needs.includes(step.map_over) ? [step.map_over] : [])];
    for (const need of needs) {
      const from = at.get(need);
      if (!from) continue;
      const x1 = from.x + boxW;
      const y1 = from.y + boxH / 2;
      const x2 = to.x;
      const y2 = to.y + boxH / 2;
      const mid = (x1 + x2) / 2;
      parts.push(svg("path", { class: ["edge", step.map_over === need ? "map" : null], d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`, "marker-end": "url(#wf-arrow)" }));
    }
  }
  for (const step of graph.steps) {
    const { x, y } = at.get(step.name);
    const items = step.item_statuses
      ? `${step.items} items: ` + Object.entries(step.item_statuses).map(([s, n]) => `${n} ${s}`).join(", ")
      : step.map_over ? `maps over ${step.map_over}` : step.status;
    const final = graph.final.includes(step.name) ? " ★" : "";
    const label = step.name.length > 20 ? step.name.slice(0, 19) + "…" : step.name;
    parts.push(
      svg(
        "a",
        { href: hrefOf(step.key), class: "step", dataset: { step: step.name, status: step.status } },
        svg("rect", { class: ["node", step.status], x, y, width: boxW, height: boxH, rx: 6 }),
        svg("text", { class: "name", x: x + 8, y: y + 18 }, label + final),
        svg("text", { class: "detail", x: x + 8, y: y + 36 }, items.length > 28 ? items.slice(0, 27) + "…" : items),
        svg("title", {}, `${step.name}: ${step.status}${step.needs.length ? `, needs ${step.needs.join(", ")}` : ""}${step.item_statuses ? `; ${items}` : ""}`),
      ),
    );
  }
  return svg("svg", { class: ["chart", "workflow"], id: "workflow-graph", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "the workflow's steps" }, parts);
}

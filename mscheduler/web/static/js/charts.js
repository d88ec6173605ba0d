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

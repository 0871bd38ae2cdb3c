/* equeue console: live plots (uPlot, vendored under /static/vendor/).
 *
 * A chart reads one or more series kinds from /api/v1/series, keeps the
 * points it has, asks only for newer ones each round (since=), aligns every
 * line on the union of their timestamps (a point a line lacks is a gap, not
 * a zero) and calls setData. window.equeueCharts[name] is the uPlot instance,
 * for tests and for a curious operator's console.
 */
"use strict";

(function (EQ) {
  const el = EQ.el;
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2",
    "#db2777", "#4b5563", "#65a30d", "#9333ea"];
  const MAX_POINTS = 4000;
  const HEIGHT = 220;
  window.equeueCharts = window.equeueCharts || {};

  // Axis ticks: compact, and whole numbers for counts (no "1, 1, 1, 0" ticks).
  const AXIS = {
    seconds: (v) => (v < 120 ? Math.round(v) + " s" : v < 7200 ? (v / 60).toFixed(v < 600 ? 1 : 0) + " min"
      : (v / 3600).toFixed(1) + " h"),
  };
  const WHOLE = new Set(["messages", "bytes"]);
  const INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4, 5e4,
    1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12];

  const FORMATS = {
    "msg/s": (v) => EQ.fmtRate(v),
    messages: (v) => EQ.fmtInt(v),
    bytes: (v) => EQ.fmtBytes(v),
    seconds: (v) => EQ.fmtDuration(v * 1000),
  };

  /* spec: {name, title, unit, sources: [{kind, key?: [..], filter?: key => bool,
   *        label: (key, kind) => string, sum?: "label"}]}
   * A source with sum adds all its series into one line (a cluster total). */
  class LiveChart {
    constructor(spec) {
      this.spec = spec;
      this.lines = new Map(); // id -> {label, times: [], values: []}
      this.since = 0;
      this.plot = null;
      this.ids = "";
      this.canvas = el("div", {class: "chart-canvas", dataset: {chart: spec.name}});
      this.empty = el("div", {class: "chart-empty"}, "waiting for two poll rounds\u2026");
      this.node = el("div", {class: "chart", id: "chart-" + spec.name},
        el("div", {class: "chart-title"}, spec.title,
          el("span", {class: "chart-unit"}, spec.unit)),
        this.canvas, this.empty);
    }

    async refresh() {
      const replies = await Promise.all(this.spec.sources.map((source) =>
        EQ.api("/api/v1/series" + EQ.query({kind: source.kind, key: source.key || [],
          since: this.since || ""}))));
      let newest = this.since;
      replies.forEach((reply, i) => {
        const source = this.spec.sources[i];
        for (const series of reply.series) {
          if (source.filter && !source.filter(series.key)) continue;
          newest = Math.max(newest, this.merge(source, series));
        }
      });
      this.since = newest;
      this.draw();
    }

    merge(source, series) {
      const label = source.sum || source.label(series.key, series.kind);
      const id = source.sum ? "sum|" + source.sum : series.kind + "|" + series.key.join("/");
      let line = this.lines.get(id);
      if (!line) {
        line = {label, points: new Map()};
        this.lines.set(id, line);
      }
      let newest = 0;
      series.times_ms.forEach((t, i) => {
        const v = series.values[i];
        newest = Math.max(newest, t);
        if (source.sum) {
          // Rounds share their timestamp across series: a sum per round.
          const held = line.points.get(t);
          line.points.set(t, v === null ? (held === undefined ? null : held) : (held || 0) + v);
        } else {
          line.points.set(t, v);
        }
      });
      while (line.points.size > MAX_POINTS) line.points.delete(line.points.keys().next().value);
      return newest;
    }

    data() {
      const times = new Set();
      for (const line of this.lines.values()) for (const t of line.points.keys()) times.add(t);
      const xs = Array.from(times).sort((a, b) => a - b);
      const ys = Array.from(this.lines.values()).map((line) =>
        xs.map((t) => (line.points.has(t) ? line.points.get(t) : null)));
      return [xs.map((t) => t / 1000), ...ys];
    }

    draw() {
      const data = this.data();
      const ids = Array.from(this.lines.keys()).join("\n");
      this.empty.hidden = data[0].length >= 2;
      if (this.plot && ids === this.ids) {
        this.plot.setData(data);
        return;
      }
      if (this.plot) this.plot.destroy();
      this.ids = ids;
      this.plot = new uPlot(this.options(), data, this.canvas);
      window.equeueCharts[this.spec.name] = this.plot;
    }

    options() {
      const format = FORMATS[this.spec.unit] || EQ.fmtRate;
      const series = [{label: "time", value: (u, v) => (v ? EQ.fmtTime(v * 1000) : "")}];
      let i = 0;
      for (const line of this.lines.values()) {
        const color = PALETTE[i % PALETTE.length];
        i += 1;
        series.push({label: line.label, stroke: color, width: 2, points: {show: false},
          value: (u, v) => (v === null || v === undefined ? EQ.dash : format(v))});
      }
      return {
        width: this.width(),
        height: HEIGHT,
        series,
        scales: {x: {time: true}, y: {range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.1 : 1]}},
        axes: [
          {stroke: "#475569", grid: {stroke: "#e2e8f0", width: 1}, ticks: {stroke: "#cbd5e1"}},
          {stroke: "#475569", size: 72, grid: {stroke: "#e2e8f0", width: 1},
            ticks: {stroke: "#cbd5e1"}, incrs: WHOLE.has(this.spec.unit) ? INCRS : undefined,
            values: (u, splits) => splits.map((v) => (AXIS[this.spec.unit] || format)(v))},
        ],
        legend: {show: true, live: true},
        cursor: {drag: {x: false, y: false}},
      };
    }

    width() {
      return Math.max(300, (this.node.clientWidth || this.node.parentNode?.clientWidth || 600) - 24);
    }

    resize() {
      if (this.plot) this.plot.setSize({width: this.width(), height: HEIGHT});
    }
  }

  EQ.LiveChart = LiveChart;
  EQ.activeCharts = [];

  // A row of charts under a card; returns the LiveChart objects.
  EQ.chartRow = function (parent, specs) {
    const row = el("div", {class: specs.length > 1 ? "charts charts-2" : "charts"});
    const charts = specs.map((spec) => new LiveChart(spec));
    charts.forEach((c) => row.append(c.node));
    parent.append(row);
    EQ.activeCharts.push(...charts);
    return charts;
  };

  EQ.refreshCharts = function (charts) {
    return Promise.all(charts.map((c) => c.refresh()));
  };

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => EQ.activeCharts.forEach((c) => c.resize()), 150);
  });
})(window.EQ);

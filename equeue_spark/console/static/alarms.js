/* equeue console: the alarms page (/alarms, from /api/v1/alarms; shapes in
 * docs/alarms.md "In the console"). Active alarms, a plot of each group lag
 * alarm's value against its threshold (the console's own group_lag series),
 * the recently resolved ones, the rules, and each notifier's queue, last
 * error and counts.
 */
"use strict";

(function (EQ) {
  const {el, num, txt, badge} = EQ;
  const MAX_PLOTS = 6;

  function valueFormat(unit) {
    if (unit === "seconds") return (v) => EQ.fmtDuration(v * 1000);
    if (unit === "bytes") return EQ.fmtBytes;
    if (unit === "messages") return EQ.fmtInt;
    if (unit === "percent") return (v) => v.toFixed(1) + " %";
    return (v) => (Number.isInteger(v) ? String(v) : EQ.fmtRate(v));
  }

  function alarmValue(testid, value, unit) {
    const format = valueFormat(unit);
    return num(testid, value, (v) => (v === null || v === undefined ? EQ.dash : format(v)));
  }

  // A group lag rule may fire on the oldest message's age: then its value
  // and threshold are seconds, though the API's unit says messages.
  function unitOf(a, rules) {
    const rule = rules.get(a.alarm);
    if (a.type === "group_lag" && rule && rule.seconds !== null && a.threshold === rule.seconds &&
        a.threshold !== rule.messages) return "seconds";
    return a.unit;
  }

  // A rule's for / resolve_for as its file would say it: "0s", "5s", "2 min 0 s".
  function ruleDuration(s) {
    if (s === null || s === undefined) return EQ.dash;
    return s < 60 ? Number(s.toFixed(3)) + "s" : EQ.fmtDuration(s * 1000);
  }

  function labelChips(labels) {
    return el("td", {dataset: {testid: "labels", value: JSON.stringify(labels || {})}},
      Object.entries(labels || {}).map(([k, v]) => el("span", {class: "label"}, k + "=" + v)));
  }

  function alarmKey(a) {
    return a.alarm + " " + JSON.stringify(a.labels || {});
  }

  function notifierState(n) {
    if (n.last_error) return "failing";
    return n.waiting ? "waiting" : "ok";
  }

  EQ.pages.alarms = {
    title: "Alarms",
    build(main) {
      this.state = el("div", {class: "stats", id: "alarm-stats"});
      this.active = EQ.section("Active alarms", "alarms-card");
      this.plots = EQ.section("Lag alarms against their thresholds", "alarm-plots");
      this.plotRow = el("div", {class: "charts charts-2", id: "alarm-plots-row"});
      this.plotNote = el("p", {class: "hint", id: "alarm-plots-note", hidden: true});
      this.plots.body.append(this.plotRow, this.plotNote);
      this.charts = new Map(); // chart name -> LiveChart
      this.resolved = EQ.section("Recently resolved", "resolved-card");
      this.rules = EQ.section("Rules", "rules-card");
      this.notes = EQ.section("Notifiers", "notifiers-card");
      this.cards = [this.active, this.plots, this.resolved, this.rules, this.notes];
      main.append(this.state, ...this.cards.map((c) => c.node));
    },
    async update() {
      const data = await EQ.api("/api/v1/alarms");
      if (!data.available) {
        EQ.clear(this.state).append(el("p", {class: "muted", id: "alarms-unavailable"},
          "Alarms are not evaluated by this console: start it with alarm rules " +
          "(--alarm-rules or --alarm-lag; docs/alarms.md) to see them here."));
        for (const card of this.cards) card.node.hidden = true;
        EQ.showHealth(data, []);
        return data.round;
      }
      const rules = new Map((data.rules || []).map((r) => [r.name, r]));
      const active = data.active || [];
      const firing = active.filter((a) => a.state === "firing" || a.state === "resolving");
      EQ.clear(this.state).append(
        EQ.stat("firing", "Firing", firing.length),
        EQ.stat("pending", "Pending", active.filter((a) => a.state === "pending").length),
        EQ.stat("rules", "Rules", rules.size),
        EQ.stat("evaluated", "Rounds evaluated", data.evaluated_rounds));
      for (const card of this.cards) card.node.hidden = false;
      this.drawActive(active, rules);
      this.drawResolved(data.resolved || [], rules);
      this.drawRules(data.rules || []);
      await this.drawNotifiers(data.notifications || []);
      EQ.showHealth(data, []);
      await this.drawPlots(active, rules);
      return data.round;
    },
    drawActive(active, rules) {
      EQ.clear(this.active.body).append(EQ.table("alarms", [
        {label: "Alarm"}, {label: "State"}, {label: "Labels"}, {label: "Value", num: true},
        {label: "Threshold", num: true}, {label: "Since", title: "when it became pending, or fired"},
        {label: "Notified", title: "the last notification sent for it"}, {label: "Summary"},
      ], active.map((a) => {
        const unit = unitOf(a, rules);
        return el("tr", {dataset: {key: alarmKey(a)}, class: "alarm-" + a.state},
          txt("alarm", a.alarm), el("td", {dataset: {testid: "state", value: a.state}}, badge(a.state)),
          labelChips(a.labels), alarmValue("value", a.value, unit),
          alarmValue("threshold", a.threshold, unit), EQ.timeCell("since", a.since_ms),
          EQ.timeCell("notified", a.notified_ms), txt("summary", a.summary || ""));
      }), "no alarm is pending or firing"));
    },
    drawResolved(resolved, rules) {
      EQ.clear(this.resolved.body).append(EQ.table("resolved", [
        {label: "Alarm"}, {label: "Labels"}, {label: "Value", num: true, title: "its last value"},
        {label: "Fired"}, {label: "Resolved"}, {label: "Reason"}, {label: "Summary"},
      ], resolved.map((a) => el("tr", {dataset: {key: alarmKey(a)}},
        txt("alarm", a.alarm), labelChips(a.labels), alarmValue("value", a.value, unitOf(a, rules)),
        EQ.timeCell("since", a.since_ms), EQ.timeCell("ended", a.ended_ms),
        txt("reason", a.reason || ""), txt("summary", a.summary || ""))), "nothing resolved lately"));
    },
    drawRules(list) {
      EQ.clear(this.rules.body).append(EQ.table("rules", [
        {label: "Rule"}, {label: "Type"}, {label: "Condition"}, {label: "For", num: true},
        {label: "Resolve for", num: true}, {label: "Notifies"},
      ], list.map((r) => el("tr", {dataset: {key: r.name}},
        txt("name", r.name), txt("type", r.type), txt("description", r.description || ""),
        num("for", r.for_s, ruleDuration), num("resolve-for", r.resolve_for_s, ruleDuration),
        txt("notify", (r.notify || []).join(", ") || EQ.dash))), "no rules"));
    },
    drawNotifiers(list) {
      EQ.clear(this.notes.body).append(EQ.table("notifiers", [
        {label: "Notifier"}, {label: "Type"}, {label: "State"},
        {label: "Waiting", num: true, title: "alerts queued for the rate limit or a retry"},
        {label: "Sent", num: true, title: "alerts sent since the console started"},
        {label: "Failed", num: true, title: "alerts whose sending failed since the console started"},
        {label: "Last error"},
      ], list.map((n) => {
        const state = notifierState(n);
        return el("tr", {dataset: {key: n.notifier}},
          txt("notifier", n.notifier), txt("type", n.type),
          el("td", {dataset: {testid: "state", value: state}}, badge(state)),
          num("waiting", n.waiting), num("sent", n.sent), num("failed", n.failed),
          txt("last-error", n.last_error || ""));
      }), "no notifier configured"));
    },
    // One plot per active group lag alarm: its series and its threshold.
    async drawPlots(active, rules) {
      const lagging = active.filter((a) => a.type === "group_lag" && a.labels &&
        a.labels.group && a.labels.topic && typeof a.threshold === "number");
      const shown = lagging.slice(0, MAX_PLOTS);
      const wanted = new Map();
      for (const a of shown) {
        const unit = unitOf(a, rules);
        const {group, topic} = a.labels;
        const name = "alarm:" + a.alarm + ":" + group + "/" + topic + ":" + unit + ":" + a.threshold;
        wanted.set(name, {name, unit, title: group + " on " + topic + " \u00b7 " + a.alarm,
          sources: [{kind: unit === "seconds" ? "group_lag_seconds" : "group_lag", key: [group, topic],
            label: () => (unit === "seconds" ? "oldest unconsumed" : "lag")}],
          constants: [{label: "threshold", value: a.threshold}]});
      }
      for (const [name, chart] of this.charts) {
        if (!wanted.has(name)) {
          chart.dispose();
          this.charts.delete(name);
        }
      }
      for (const [name, spec] of wanted) {
        if (this.charts.has(name)) continue;
        const chart = new EQ.LiveChart(spec);
        this.plotRow.append(chart.node);
        EQ.activeCharts.push(chart);
        this.charts.set(name, chart);
      }
      const more = lagging.length - shown.length;
      this.plotNote.hidden = more <= 0;
      this.plotNote.textContent = more > 0 ? more + " more lag alarms are not plotted" : "";
      this.plots.node.hidden = wanted.size === 0;
      await EQ.refreshCharts(Array.from(this.charts.values()));
    },
  };
})(window.EQ);

/* equeue console: the figure pages (cluster, topics, topic, groups, group,
 * transactions, alarms). Each page is {title, build(main, arg), update()}:
 * build lays out the page once (cards, charts, admin forms), update fetches
 * the page's JSON and redraws its tables and charts, and returns the poll
 * round it showed. Forms are built once so a round never wipes what an
 * operator is typing.
 */
"use strict";

(function (EQ) {
  const {el, num, txt, badge, link} = EQ;
  const pages = (EQ.pages = EQ.pages || {});
  const enc = encodeURIComponent;

  function yesNo(testid, value) {
    return el("td", {dataset: {testid, value: String(value)}}, badge(value ? "yes" : "no", value ? "yes" : "no"));
  }

  function stateCell(state, why) {
    return el("td", {dataset: {testid: "state", value: state}, title: why || null}, badge(state));
  }

  function retention(rows) {
    if (!rows || !rows.length) return EQ.dash;
    const seen = new Set(rows.map((r) =>
      (r.max_age_ms ? EQ.fmtDuration(r.max_age_ms) : "no age limit") + " / " +
      (r.max_bytes ? EQ.fmtBytes(r.max_bytes) : "no size limit")));
    return Array.from(seen).join("; ");
  }

  function schemaText(schema) {
    return schema ? "v" + schema.version + " " + schema.type : EQ.dash;
  }

  function partialNote(unreachable) {
    return unreachable && unreachable.length
      ? "partial: " + unreachable.join(", ") + " not answering (their queues are missing)" : null;
  }

  /* -- cluster ------------------------------------------------------------------- */

  pages.cluster = {
    title: "Cluster",
    build(main) {
      this.stats = el("div", {class: "stats", id: "cluster-stats"});
      main.append(this.stats);
      const plots = EQ.section("Throughput and replication", "cluster-plots");
      this.charts = EQ.chartRow(plots.body, [
        {name: "cluster_rate", title: "Cluster produce / consume rate", unit: "msg/s",
          sources: [
            {kind: "topic_in", sum: "produced"},
            {kind: "topic_out", sum: "consumed"},
          ]},
        {name: "replica_lag", title: "Replica lag", unit: "bytes",
          sources: [{kind: "replica_lag", label: (k) => k.join(" \u2192 ")}]},
      ]);
      this.members = EQ.section("Brokers", "members-card");
      this.replicas = EQ.section("Replicas", "replicas-card");
      this.namesrvs = EQ.section("Name servers", "namesrvs-card");
      main.append(plots.node, this.members.node, this.replicas.node, this.namesrvs.node);
    },
    async update() {
      const data = await EQ.api("/api/v1/cluster");
      const members = data.members.slice().sort((a, b) =>
        (a.broker + a.address).localeCompare(b.broker + b.address));
      this.drawStats(members);
      EQ.clear(this.members.body).append(EQ.table("members", [
        {label: "Broker group"}, {label: "Address"}, {label: "Role"}, {label: "Epoch", num: true},
        {label: "State"}, {label: "Uptime", num: true}, {label: "Disk used", num: true},
        {label: "Free", num: true, title: "free space of the data directory's disk"}, {label: "In/s", num: true, title: "messages in per second (the broker's 1-minute average)"},
        {label: "Out/s", num: true, title: "messages out per second (the broker's 1-minute average)"}, {label: "Backlog", num: true},
        {label: "Txns", num: true, title: "open transactions"},
        {label: "Delayed", num: true, title: "delayed messages pending"},
      ], members.map(memberRow), "no broker registered"));
      const replicas = [];
      for (const m of members) {
        for (const r of m.replicas || []) replicas.push(replicaRow(m, r));
      }
      EQ.clear(this.replicas.body).append(EQ.table("replicas", [
        {label: "Broker group"}, {label: "Master"}, {label: "Replica"}, {label: "Replica id"},
        {label: "Lag", num: true}, {label: "In sync"}, {label: "Connected"},
        {label: "Last seen", num: true},
      ], replicas, "no replica is attached to a master"));
      EQ.clear(this.namesrvs.body).append(EQ.table("namesrvs", [
        {label: "Address"}, {label: "State"}, {label: "Brokers", num: true}, {label: "Error"},
      ], data.namesrvs.map((n) => el("tr", {dataset: {key: n.address}},
        txt("address", n.address), stateCell(n.state === "up" ? "up" : "down"),
        num("brokers", n.brokers), txt("error", n.error || ""))),
      "a single broker: no name servers"));
      const dead = members.filter((m) => m.state === "unreachable" || m.state === "down");
      EQ.showHealth(data, dead.map((m) =>
        (m.broker || "broker") + " " + m.address + " is " + m.state + (m.error ? ": " + m.error : "")));
      await EQ.refreshCharts(this.charts);
      return data.round;
    },
    drawStats(members) {
      const answering = members.filter((m) => m.stats).length;
      const masters = members.filter((m) => m.role === "master" && m.stats);
      const sum = (list, f) => list.reduce((acc, x) => acc + (f(x) || 0), 0);
      const groups = new Set(members.map((m) => m.broker));
      EQ.clear(this.stats).append(
        EQ.stat("members-answering", "Brokers answering", answering, null, "of " + members.length),
        EQ.stat("broker-groups", "Broker groups", groups.size),
        EQ.stat("backlog", "Backlog (masters)", sum(masters, (m) => m.stats.total_backlog)),
        EQ.stat("in-rate", "Produce msg/s", sum(masters, (m) => m.in_rate), EQ.fmtRate),
        EQ.stat("out-rate", "Consume msg/s", sum(masters, (m) => m.out_rate), EQ.fmtRate),
        EQ.stat("open-txns", "Open transactions", sum(masters, (m) => m.stats.open_transactions)),
        EQ.stat("disk-used", "Disk used", sum(members, (m) => m.stats && m.stats.disk_used_bytes),
          EQ.fmtBytes));
    },
  };

  function memberRow(m) {
    const s = m.stats;
    const freePct = s && s.disk_size_bytes ? (100 * s.disk_free_bytes) / s.disk_size_bytes : null;
    const row = el("tr", {class: s ? null : "row-dead", dataset: {key: m.address, broker: m.broker}},
      txt("broker", m.broker || EQ.dash),
      txt("address", m.address),
      el("td", {dataset: {testid: "role", value: m.role}},
        badge(m.role === "master" ? "master" : "replica", m.role),
        m.routed_master ? el("span", {class: "hint", title: "the name servers route writes here"}, " routed") : null),
      num("epoch", m.epoch),
      stateCell(m.state, m.error),
      num("uptime", s ? s.uptime_s : null, (v) => EQ.fmtDuration(v * 1000)),
      num("disk-used", s ? s.disk_used_bytes : null, EQ.fmtBytes),
      num("disk-free", freePct, (v) => (v === null ? EQ.dash : v.toFixed(1) + " %")),
      num("in-rate", m.in_rate, EQ.fmtRate),
      num("out-rate", m.out_rate, EQ.fmtRate),
      num("backlog", s ? s.total_backlog : null),
      num("open-txns", s ? s.open_transactions : null),
      num("delayed", s ? s.delayed_pending : null));
    return row;
  }

  function replicaRow(master, r) {
    return el("tr", {dataset: {key: r.address, broker: master.broker}},
      txt("broker", master.broker || EQ.dash), txt("master", master.address),
      txt("address", r.address), txt("replica-id", r.replica_id),
      num("lag-bytes", r.lag_bytes, EQ.fmtBytes), yesNo("in-sync", r.in_sync),
      yesNo("connected", r.connected),
      num("last-seen", r.last_seen_s, (v) => EQ.fmtDuration(v * 1000) + " ago"));
  }

  /* -- topics ---------------------------------------------------------------------- */

  pages.topics = {
    title: "Topics",
    build(main, arg) {
      if (arg) return pages.topic.build.call(this, main, arg);
      this.internal = el("input", {type: "checkbox", id: "show-internal",
        on: {change: () => EQ.refresh()}});
      const toggle = el("label", {class: "toggle"}, this.internal, " internal topics (%RETRY%, %DLQ%, \u2026)");
      this.list = EQ.section("All topics", "topics-card", toggle);
      const plots = EQ.section("Produce rate per topic", "topics-plots");
      this.charts = EQ.chartRow(plots.body, [
        {name: "topics_in", title: "Messages in per topic", unit: "msg/s",
          sources: [{kind: "topic_in", label: (k) => k[0], filter: (k) => !k[0].startsWith("%")}]},
      ]);
      main.append(this.list.node, plots.node);
    },
    async update() {
      if (this.topicName) return pages.topic.update.call(this);
      const data = await EQ.api("/api/v1/topics" + (this.internal.checked ? "" : "?internal=0"));
      const partial = new Set();
      const rows = data.topics.map((t) => {
        (t.unreachable_brokers || []).forEach((b) => partial.add(b));
        return el("tr", {dataset: {key: t.name}, class: t.internal ? "row-internal" : null},
          el("td", {dataset: {testid: "name", value: t.name}}, link("/topics/" + enc(t.name), t.name),
            t.unreachable_brokers.length ? badge("partial") : null),
          txt("brokers", t.brokers.join(", ")),
          num("queues", t.queue_count), num("stored", t.stored), num("backlog", t.backlog),
          num("in-rate", t.in_rate, EQ.fmtRate), num("out-rate", t.out_rate, EQ.fmtRate),
          num("delayed", t.delayed_pending),
          txt("retention", retention(t.retention)),
          txt("schema", schemaText(t.schema)));
      });
      EQ.clear(this.list.body).append(EQ.table("topics", [
        {label: "Topic"}, {label: "Broker groups"}, {label: "Queues", num: true},
        {label: "Stored", num: true, title: "messages held (end - earliest)"},
        {label: "Backlog", num: true, title: "messages not consumed by every group"},
        {label: "In msg/s", num: true}, {label: "Out msg/s", num: true},
        {label: "Delayed", num: true}, {label: "Retention (age / size)"}, {label: "Schema"},
      ], rows, "no topics"));
      const extra = partial.size ? [partialNote(Array.from(partial).sort())] : [];
      if (data.stale.length) extra.push("partial: " + data.stale.join(", ") + " stale");
      EQ.showHealth(data, extra);
      await EQ.refreshCharts(this.charts);
      return data.round;
    },
  };

  pages.topic = {
    build(main, name) {
      this.topicName = name;
      this.stats = el("div", {class: "stats", id: "topic-stats"});
      main.append(this.stats);
      const plots = EQ.section("Rates", "topic-plots");
      this.charts = EQ.chartRow(plots.body, [
        {name: "topic_rate", title: "Messages in / out", unit: "msg/s", sources: [
          {kind: "topic_in", key: [name], label: () => "in"},
          {kind: "topic_out", key: [name], label: () => "out"}]},
      ]);
      this.queues = EQ.section("Queues", "queues-card");
      this.readers = EQ.section("Groups reading it", "readers-card");
      main.append(plots.node, this.queues.node, this.readers.node);
      this.admin = EQ.section("Add queues", "add-queues-card");
      this.admin.node.hidden = true;
      main.append(this.admin.node);
      EQ.actions.addQueuesForm(this.admin, name);
    },
    async update() {
      const data = await EQ.api("/api/v1/topics/" + enc(this.topicName));
      const t = data.topic;
      EQ.clear(this.stats).append(
        EQ.stat("queues", "Queues", t.queue_count, null, t.brokers.join(", ")),
        EQ.stat("stored", "Stored", t.stored), EQ.stat("backlog", "Backlog", t.backlog),
        EQ.stat("in-rate", "In msg/s", t.in_rate, EQ.fmtRate),
        EQ.stat("out-rate", "Out msg/s", t.out_rate, EQ.fmtRate),
        EQ.stat("delayed", "Delayed pending", t.delayed_pending),
        el("div", {class: "stat"}, el("div", {class: "stat-label"}, "Value schema"),
          el("div", {class: "stat-value small", dataset: {testid: "schema"}}, schemaText(t.schema))),
        el("div", {class: "stat"}, el("div", {class: "stat-label"}, "Retention"),
          el("div", {class: "stat-value small", dataset: {testid: "retention"}}, retention(t.retention))));
      EQ.clear(this.queues.body).append(EQ.table("queues", [
        {label: "Broker group"}, {label: "Queue", num: true}, {label: "Earliest", num: true},
        {label: "End", num: true}, {label: "Stored", num: true},
        {label: "Min committed", num: true}, {label: "Backlog", num: true},
        {label: "Producers"}, {label: "Consumers"},
      ], t.queues.map((q) => el("tr", {dataset: {key: q.broker + "/" + q.queue_id}},
        txt("broker", q.broker || EQ.dash), num("queue", q.queue_id),
        num("earliest", q.earliest_offset), num("end", q.end_offset), num("stored", q.stored),
        num("min-committed", q.min_committed_offset), num("backlog", q.backlog),
        yesNo("producer-visible", q.producer_visible), yesNo("consumer-visible", q.consumer_visible)))));
      EQ.clear(this.readers.body).append(EQ.table("readers", [
        {label: "Group"}, {label: "Lag", num: true}, {label: "Lag (age)", num: true},
      ], data.groups.map((g) => el("tr", {dataset: {key: g.group}},
        el("td", {dataset: {testid: "group", value: g.group}}, link("/groups/" + enc(g.group), g.group)),
        num("lag", g.lag), num("lag-ms", g.lag_ms, EQ.fmtDuration))), "no group reads this topic"));
      const note = partialNote(t.unreachable_brokers);
      EQ.showHealth(data, note ? [note] : []);
      EQ.actions.showAdmin(this.admin.node, t);
      await EQ.refreshCharts(this.charts);
      return data.round;
    },
  };

  /* -- groups ------------------------------------------------------------------------ */

  pages.groups = {
    title: "Consumer groups",
    build(main, arg) {
      if (arg) return pages.group.build.call(this, main, arg);
      this.list = EQ.section("All groups", "groups-card");
      const plots = EQ.section("Lag", "groups-plots");
      this.charts = EQ.chartRow(plots.body, [
        {name: "groups_lag", title: "Lag per group and topic", unit: "messages",
          sources: [{kind: "group_lag", label: (k) => k.join(" / "), filter: (k) => !k[1].startsWith("%")}]},
      ]);
      main.append(this.list.node, plots.node);
    },
    async update() {
      if (this.groupName) return pages.group.update.call(this);
      const data = await EQ.api("/api/v1/groups");
      const partial = new Set();
      const rows = data.groups.map((g) => {
        (g.unreachable_brokers || []).forEach((b) => partial.add(b));
        return el("tr", {dataset: {key: g.group}},
          el("td", {dataset: {testid: "group", value: g.group}}, link("/groups/" + enc(g.group), g.group),
            g.unreachable_brokers.length ? badge("partial") : null),
          num("members", g.members.length),
          txt("topics", g.topics.map((t) => t.topic).filter((t) => !t.startsWith("%")).join(", ")),
          num("lag", g.total_lag), num("lag-ms", g.max_lag_ms, EQ.fmtDuration),
          num("retry", g.retry_messages), num("dlq", g.dlq_messages), num("resent", g.dlq_resent));
      });
      EQ.clear(this.list.body).append(EQ.table("groups", [
        {label: "Group"}, {label: "Members", num: true}, {label: "Topics"},
        {label: "Lag", num: true}, {label: "Oldest unconsumed", num: true},
        {label: "Retry", num: true}, {label: "Dead letters", num: true}, {label: "Resent", num: true},
      ], rows, "no consumer groups"));
      const extra = partial.size ? [partialNote(Array.from(partial).sort())] : [];
      EQ.showHealth(data, extra);
      await EQ.refreshCharts(this.charts);
      return data.round;
    },
  };

  pages.group = {
    build(main, name) {
      this.groupName = name;
      this.stats = el("div", {class: "stats", id: "group-stats"});
      main.append(this.stats);
      const plots = EQ.section("Lag over time", "group-plots");
      const mine = (k) => k[0] === name;
      this.charts = EQ.chartRow(plots.body, [
        {name: "group_lag", title: "Lag per topic", unit: "messages",
          sources: [{kind: "group_lag", filter: mine, label: (k) => k[1]}]},
        {name: "group_lag_seconds", title: "Oldest unconsumed message", unit: "seconds",
          sources: [{kind: "group_lag_seconds", filter: mine, label: (k) => k[1]}]},
      ]);
      this.queues = EQ.section("Queues", "group-queues-card");
      this.members = EQ.section("Members", "group-members-card");
      main.append(plots.node, this.queues.node, this.members.node);
      this.dlq = EQ.section("Dead letters", "dlq-card");
      this.reset = EQ.section("Reset offsets", "reset-card");
      this.reset.node.hidden = true;
      main.append(this.dlq.node, this.reset.node);
      this.dlqCount = null;
      EQ.actions.resetForm(this.reset, name);
    },
    async update() {
      const name = this.groupName;
      const data = await EQ.api("/api/v1/groups/" + enc(name));
      const g = data.group;
      EQ.clear(this.stats).append(
        EQ.stat("members", "Members", g.members.length),
        EQ.stat("lag", "Lag", g.total_lag),
        EQ.stat("lag-ms", "Oldest unconsumed", g.max_lag_ms, EQ.fmtDuration),
        EQ.stat("retry", "Waiting retry", g.retry_messages),
        EQ.stat("dlq", "Dead letters", g.dlq_messages),
        EQ.stat("resent", "Resent", g.dlq_resent));
      const queues = g.queues.slice().sort((a, b) =>
        (a.topic + a.broker).localeCompare(b.topic + b.broker) || a.queue_id - b.queue_id);
      EQ.clear(this.queues.body).append(EQ.table("group-queues", [
        {label: "Topic"}, {label: "Broker group"}, {label: "Queue", num: true},
        {label: "Committed", num: true}, {label: "End", num: true}, {label: "Lag", num: true},
        {label: "Lag (age)", num: true}, {label: "Consumer"},
      ], queues.map((q) => el("tr", {dataset: {key: q.broker + "/" + q.topic + "/" + q.queue_id}},
        el("td", {dataset: {testid: "topic", value: q.topic}}, link("/topics/" + enc(q.topic), q.topic)),
        txt("broker", q.broker || EQ.dash), num("queue", q.queue_id),
        num("committed", q.committed_offset), num("end", q.end_offset), num("lag", q.lag),
        num("lag-ms", q.lag_ms, EQ.fmtDuration), txt("consumer", q.consumer_id || EQ.dash))),
      "the group has no committed offsets"));
      EQ.clear(this.members.body).append(g.members.length
        ? el("ul", {class: "members", id: "group-members"}, g.members.map((m) => el("li", {}, m)))
        : el("p", {class: "muted", id: "group-members"}, "no live member (offsets can be reset)"));
      const note = partialNote(g.unreachable_brokers);
      EQ.showHealth(data, note ? [note] : []);
      EQ.actions.showAdmin(this.reset.node, g);
      if (this.dlqCount !== g.dlq_messages) {
        this.dlqCount = g.dlq_messages; // dead letters are asked of the brokers: only on change
        await EQ.actions.deadLetters(this.dlq, name, g.dlq_messages);
      }
      await EQ.refreshCharts(this.charts);
      return data.round;
    },
  };

  /* -- transactions ------------------------------------------------------------------ */

  pages.transactions = {
    title: "Transactions",
    build(main) {
      this.stats = el("div", {class: "stats", id: "txn-stats"});
      this.open = EQ.section("Open transactions", "txns-card");
      this.delayed = EQ.section("Pending delayed messages", "delayed-card");
      main.append(this.stats, this.open.node, this.delayed.node);
    },
    async update() {
      const data = await EQ.api("/api/v1/transactions");
      const pending = data.delayed.reduce((acc, d) => acc + d.pending, 0);
      EQ.clear(this.stats).append(
        EQ.stat("txn-count", "Open transactions", data.transactions.length),
        EQ.stat("staged-messages", "Staged messages",
          data.transactions.reduce((acc, t) => acc + t.messages, 0)),
        EQ.stat("delayed-count", "Delayed pending", pending));
      EQ.clear(this.open.body).append(EQ.table("transactions", [
        {label: "Broker group"}, {label: "Transaction"}, {label: "Group"}, {label: "Age", num: true},
        {label: "Messages", num: true}, {label: "Bytes", num: true}, {label: "State"},
        {label: "Checks", num: true}, {label: "Next check"},
      ], data.transactions.map((t) => el("tr", {dataset: {key: t.broker + "/" + t.transaction_id}},
        txt("broker", t.broker || EQ.dash), txt("id", t.transaction_id), txt("group", t.group || EQ.dash),
        num("age", t.age_ms, EQ.fmtDuration), num("messages", t.messages),
        num("bytes", t.bytes, EQ.fmtBytes),
        el("td", {dataset: {testid: "committing", value: String(t.committing)}},
          badge(t.committing ? "committing" : "open")),
        num("checks", t.checks), EQ.timeCell("next-check", t.next_check_ms))),
      "no open transaction"));
      EQ.clear(this.delayed.body).append(EQ.table("delayed", [
        {label: "Topic"}, {label: "Pending", num: true}, {label: "Next due"},
      ], data.delayed.map((d) => el("tr", {dataset: {key: d.topic}},
        el("td", {dataset: {testid: "topic", value: d.topic}}, link("/topics/" + enc(d.topic), d.topic)),
        num("pending", d.pending), EQ.timeCell("next-due", d.next_due_ms))),
      "no delayed message is pending"));
      EQ.showHealth(data, []);
      return data.round;
    },
  };

  /* -- alarms -------------------------------------------------------------------------- */

  function sinceMs(v) {
    if (typeof v !== "number" || v <= 0) return null;
    return v > 1e12 ? v : v * 1000; // the alarm engine counts seconds since the epoch
  }

  function alarmValue(testid, value, unit) {
    const format = unit === "seconds" ? (v) => EQ.fmtDuration(v * 1000)
      : unit === "bytes" ? EQ.fmtBytes : unit === "messages" ? EQ.fmtInt : EQ.fmtRate;
    return num(testid, value, (v) => (v === null || v === undefined ? EQ.dash : format(v)));
  }

  function labelChips(labels) {
    return el("td", {dataset: {testid: "labels", value: JSON.stringify(labels || {})}},
      Object.entries(labels || {}).map(([k, v]) => el("span", {class: "label"}, k + "=" + v)));
  }

  function alarmKey(a) {
    return a.alarm + " " + JSON.stringify(a.labels || {});
  }

  pages.alarms = {
    title: "Alarms",
    build(main) {
      this.state = el("div", {class: "stats", id: "alarm-stats"});
      this.active = EQ.section("Active alarms", "alarms-card");
      this.resolved = EQ.section("Recently resolved", "resolved-card");
      this.rules = EQ.section("Rules", "rules-card");
      this.notes = EQ.section("Notifiers", "notifiers-card");
      this.cards = [this.active, this.resolved, this.rules, this.notes];
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
      const active = data.active || [];
      const firing = active.filter((a) => a.state === "firing" || a.state === "resolving");
      EQ.clear(this.state).append(
        EQ.stat("firing", "Firing", firing.length),
        EQ.stat("pending", "Pending", active.filter((a) => a.state === "pending").length),
        EQ.stat("rules", "Rules", (data.rules || []).length),
        EQ.stat("evaluated", "Rounds evaluated", data.evaluated_rounds));
      for (const card of this.cards) card.node.hidden = false;
      EQ.clear(this.active.body).append(EQ.table("alarms", [
        {label: "Alarm"}, {label: "State"}, {label: "Labels"}, {label: "Value", num: true},
        {label: "Threshold", num: true}, {label: "Since"}, {label: "Summary"},
      ], active.map((a) => el("tr", {dataset: {key: alarmKey(a)}, class: "alarm-" + a.state},
        txt("alarm", a.alarm), el("td", {dataset: {testid: "state", value: a.state}}, badge(a.state)),
        labelChips(a.labels), alarmValue("value", a.value, a.unit),
        alarmValue("threshold", a.threshold, a.unit), EQ.timeCell("since", sinceMs(a.since)),
        txt("summary", a.summary || ""))), "no alarm is pending or firing"));
      EQ.clear(this.resolved.body).append(EQ.table("resolved", [
        {label: "Alarm"}, {label: "Labels"}, {label: "Fired"}, {label: "Resolved"},
        {label: "Reason"}, {label: "Summary"},
      ], (data.resolved || []).map((a) => el("tr", {dataset: {key: alarmKey(a)}},
        txt("alarm", a.alarm), labelChips(a.labels), EQ.timeCell("since", sinceMs(a.since)),
        EQ.timeCell("ended", sinceMs(a.ended)), txt("reason", a.reason || ""),
        txt("summary", a.summary || ""))), "nothing resolved lately"));
      EQ.clear(this.rules.body).append(EQ.table("rules", [
        {label: "Rule"}, {label: "Type"}, {label: "Condition"}, {label: "For", num: true},
        {label: "Notifies"},
      ], (data.rules || []).map((r) => el("tr", {dataset: {key: r.name}},
        txt("name", r.name), txt("type", r.type), txt("description", r.description || ""),
        num("for", r.for_s, (v) => EQ.fmtDuration(v * 1000)),
        txt("notify", (r.notify || []).join(", ") || EQ.dash))), "no rules"));
      EQ.clear(this.notes.body).append(EQ.table("notifiers", [
        {label: "Notifier"}, {label: "Type"}, {label: "Waiting", num: true}, {label: "Last error"},
      ], (data.notifications || []).map((n) => el("tr", {dataset: {key: n.notifier}},
        txt("notifier", n.notifier), txt("type", n.type), num("waiting", n.waiting),
        txt("last-error", n.last_error || ""))), "no notifier configured"));
      EQ.showHealth(data, []);
      return data.round;
    },
  };
})(window.EQ);

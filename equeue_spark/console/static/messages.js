/* equeue console: the message browser (by offset, by id, by key and time
 * range, by time range). The query lives in the page's URL, so a view can be
 * shared; results are asked when the form is sent, never each round (each
 * message is a call to a broker). Values are shown as text (JSON pretty
 * printed), as a hex dump when they are not UTF-8, and decoded when their
 * record names a schema.
 */
"use strict";

(function (EQ) {
  const el = EQ.el;
  const enc = encodeURIComponent;
  const MODES = {
    offset: ["topic", "broker", "queue", "offset", "count"],
    id: ["id"],
    key: ["topic", "key", "start", "end", "limit"],
    time: ["topic", "start", "end", "limit"],
  };

  function input(name, attrs) {
    return el("input", Object.assign({id: "msg-" + name, name}, attrs || {}));
  }

  function utcInput(ms) {
    return new Date(ms).toISOString().slice(0, 19);
  }

  function hexDump(hex) {
    const lines = [];
    for (let i = 0; i < hex.length; i += 32) {
      const chunk = hex.slice(i, i + 32);
      const bytes = chunk.match(/../g) || [];
      const ascii = bytes.map((b) => {
        const c = parseInt(b, 16);
        return c >= 32 && c < 127 ? String.fromCharCode(c) : ".";
      }).join("");
      lines.push((i / 2).toString(16).padStart(8, "0") + "  " + bytes.join(" ").padEnd(48) + "  " + ascii);
    }
    return lines.join("\n");
  }

  function shownValue(value, testid) {
    if (!value) return el("span", {class: "muted", dataset: {testid}}, "(none)");
    const note = value.truncated ? " (first 64 KiB of " + EQ.fmtBytes(value.size) + ")" : "";
    if (value.hex !== undefined) {
      return el("div", {}, el("div", {class: "hint"}, "not UTF-8: hex dump" + note),
        el("pre", {class: "value hex", dataset: {testid, encoding: "hex"}}, hexDump(value.hex)));
    }
    const text = value.json !== undefined && typeof value.json === "object" && value.json !== null
      ? JSON.stringify(value.json, null, 2) : value.text;
    return el("div", {}, note ? el("div", {class: "hint"}, note) : null,
      el("pre", {class: "value", dataset: {testid, encoding: "text"}}, text));
  }

  function decoded(d, testid, topic) {
    if (!d) return null;
    if (d.error) {
      return el("div", {class: "decoded error", dataset: {testid}}, "schema v" + d.version + ": " + d.error);
    }
    return el("div", {class: "decoded"},
      el("div", {class: "hint"}, "decoded with schema v" + d.version + " (" + d.type + ") of ",
        EQ.link("/topics/" + enc(topic), topic)),
      el("pre", {class: "value", dataset: {testid}}, JSON.stringify(d.value, null, 2)));
  }

  function messageCard(m) {
    const headers = (m.headers || []).map((h) => el("tr", {},
      el("td", {class: "mono"}, h.name),
      el("td", {class: "mono"}, h.text !== undefined ? h.text : "0x" + h.hex)));
    const key = m.key ? (m.key.text !== undefined ? m.key.text : "0x" + m.key.hex) : null;
    return el("article", {class: "message", dataset: {id: m.id, offset: m.offset}},
      el("div", {class: "message-head"},
        el("span", {class: "mono strong", dataset: {testid: "id"}}, m.id),
        el("span", {}, m.topic + " \u00b7 " + (m.broker_id || "") + " queue " + m.queue_id + " @ "),
        el("span", {class: "mono", dataset: {testid: "offset", value: m.offset}}, String(m.offset)),
        el("a", {class: "download", href: "/api/v1/messages/raw?id=" + enc(m.id)}, "download value")),
      el("dl", {class: "facts"},
        el("dt", {}, "born"), el("dd", {title: EQ.localTime(m.timestamp_ms)}, EQ.fmtTime(m.timestamp_ms)),
        el("dt", {}, "stored"), el("dd", {title: EQ.localTime(m.store_timestamp_ms)}, EQ.fmtTime(m.store_timestamp_ms)),
        el("dt", {}, "key"), el("dd", {class: "mono", dataset: {testid: "key"}}, key === null ? "(none)" : key),
        el("dt", {}, "tag"), el("dd", {}, m.tag || "(none)"),
        el("dt", {}, "size"), el("dd", {}, m.value ? EQ.fmtBytes(m.value.size) : EQ.dash)),
      headers.length ? el("table", {class: "grid headers"},
        el("thead", {}, el("tr", {}, el("th", {}, "Header"), el("th", {}, "Value"))),
        el("tbody", {}, headers)) : null,
      decoded(m.decoded_key, "decoded-key", m.topic),
      decoded(m.decoded, "decoded", m.topic),
      m.decoded || m.decoded_key ? el("div", {class: "hint raw-label"}, "the value as stored:") : null,
      shownValue(m.value, "value"));
  }

  EQ.pages.messages = {
    title: "Messages",
    build(main) {
      const f = (this.fields = {
        mode: el("select", {id: "msg-mode", name: "mode"},
          el("option", {value: "offset"}, "by offset"), el("option", {value: "id"}, "by id"),
          el("option", {value: "key"}, "by key and time"), el("option", {value: "time"}, "by time range")),
        topic: input("topic", {list: "msg-topics", placeholder: "topic", autocomplete: "off"}),
        broker: input("broker", {placeholder: "a (cluster only)", size: 8}),
        queue: input("queue", {type: "number", min: 0, value: 0}),
        offset: input("offset", {type: "number", min: 0, value: 0}),
        count: input("count", {type: "number", min: 1, max: 100, value: 20}),
        id: input("id", {placeholder: "message id", size: 24}),
        key: input("key", {placeholder: "key"}),
        start: input("start", {type: "datetime-local", step: 1}),
        end: input("end", {type: "datetime-local", step: 1}),
        limit: input("limit", {type: "number", min: 1, max: 100, value: 20}),
      });
      this.topics = el("datalist", {id: "msg-topics"});
      const labels = {mode: "Find", topic: "Topic", broker: "Broker group", queue: "Queue",
        offset: "From offset", count: "Count", id: "Message id", key: "Key",
        start: "From (UTC)", end: "To (UTC)", limit: "At most"};
      this.wrappers = {};
      const row = el("form", {class: "form-row", id: "msg-form"});
      for (const [name, control] of Object.entries(f)) {
        this.wrappers[name] = el("label", {class: "field"}, el("span", {}, labels[name]), control);
        row.append(this.wrappers[name]);
      }
      const submit = el("button", {type: "submit", id: "msg-submit", class: "primary"}, "Show");
      row.append(submit, this.topics);
      row.addEventListener("submit", (event) => {
        event.preventDefault();
        this.search();
      });
      f.mode.addEventListener("change", () => this.layout());
      const card = EQ.section("Message browser", "browser-card");
      card.body.append(row);
      this.status = el("div", {class: "result", id: "msg-status"});
      this.results = el("div", {id: "msg-results"});
      this.more = el("button", {type: "button", id: "msg-next", hidden: true}, "Next page");
      this.more.addEventListener("click", () => {
        f.offset.value = this.next;
        this.search();
      });
      card.body.append(this.status, this.results, this.more);
      main.append(card.node);
      this.prefill();
      EQ.api("/api/v1/topics").then((data) => {
        for (const t of data.topics) this.topics.append(el("option", {value: t.name}));
      }).catch(() => {});
    },
    prefill() {
      const q = new URLSearchParams(location.search);
      const f = this.fields;
      f.mode.value = q.get("id") ? "id" : q.get("mode") || (q.get("key") ? "key" : "offset");
      for (const name of ["topic", "broker", "queue", "offset", "count", "id", "key", "limit"]) {
        if (q.get(name) !== null) f[name].value = q.get(name);
      }
      for (const name of ["start", "end"]) {
        const ms = Number(q.get(name + "_ms"));
        if (ms) f[name].value = utcInput(ms);
      }
      this.layout();
      if (q.get("id") || q.get("topic")) this.search();
    },
    layout() {
      const shown = new Set(["mode", ...MODES[this.fields.mode.value]]);
      for (const [name, wrapper] of Object.entries(this.wrappers)) wrapper.hidden = !shown.has(name);
    },
    params() {
      const f = this.fields;
      const mode = f.mode.value;
      const p = {};
      for (const name of MODES[mode]) {
        if (name === "start" || name === "end") {
          if (f[name].value) p[name + "_ms"] = Date.parse(f[name].value + "Z");
        } else if (f[name].value !== "") {
          p[name] = f[name].value.trim();
        }
      }
      if (mode === "time") delete p.key;
      return p;
    },
    async search() {
      const p = this.params();
      const mode = this.fields.mode.value;
      history.replaceState(null, "", "/messages" + EQ.query(Object.assign({mode}, p)));
      this.status.dataset.state = "busy";
      this.status.textContent = "asking the brokers\u2026";
      EQ.clear(this.results);
      this.more.hidden = true;
      let reply;
      try {
        reply = await EQ.api("/api/v1/messages" + EQ.query(p));
      } catch (error) {
        this.status.dataset.state = "error";
        this.status.textContent = error.message;
        return;
      }
      const messages = reply.messages || (reply.message ? [reply.message] : []);
      this.status.dataset.state = "ok";
      this.status.dataset.count = messages.length;
      this.status.textContent = messages.length + " message" + (messages.length === 1 ? "" : "s") +
        (reply.truncated ? " (more match: narrow the time range)" : "");
      for (const m of messages) this.results.append(messageCard(m));
      if (mode === "offset" && reply.next_offset !== undefined && reply.next_offset !== null &&
          messages.length >= Number(p.count || 20)) {
        this.next = reply.next_offset;
        this.more.hidden = false;
      }
    },
    async update() {
      return null; // nothing here changes with a poll round
    },
  };
})(window.EQ);

/* equeue console: admin actions (add queues, reset a group's offsets, resend
 * or purge dead letters) and the dead-letter list.
 *
 * The forms exist only for a user whose token has the admin role
 * (/api/v1/whoami says "admin": true); everyone else sees none. The console
 * makes each action with the user's own token, so the brokers check it again.
 * Destructive buttons ask for a second click (or the group's name typed)
 * rather than a dialog.
 */
"use strict";

(function (EQ) {
  const el = EQ.el;
  const enc = encodeURIComponent;
  const actions = (EQ.actions = {});

  actions.showAdmin = function (node, row) {
    const may = Boolean(EQ.whoami && EQ.whoami.admin);
    node.hidden = !may;
    if (may && node.eqFill) node.eqFill(row);
  };

  function result(id) {
    return el("div", {class: "result", id, role: "status"});
  }

  function report(node, ok, message) {
    node.dataset.state = ok ? "ok" : "error";
    node.textContent = message;
  }

  // A button that acts on its second click within 6 s.
  function armed(button, label, confirmLabel, act) {
    let timer = null;
    button.addEventListener("click", async (event) => {
      event.preventDefault();
      if (button.dataset.armed !== "1") {
        button.dataset.armed = "1";
        button.textContent = confirmLabel();
        button.classList.add("danger");
        timer = setTimeout(() => disarm(), 6000);
        return;
      }
      disarm();
      button.disabled = true;
      try {
        await act();
      } finally {
        button.disabled = false;
      }
    });
    function disarm() {
      clearTimeout(timer);
      button.dataset.armed = "0";
      button.textContent = label;
      button.classList.remove("danger");
    }
  }

  function options(select, values, labels) {
    const current = select.value;
    const wanted = values.join("\n");
    if (select.dataset.options === wanted) return;
    select.dataset.options = wanted;
    EQ.clear(select);
    values.forEach((v, i) => select.append(el("option", {value: v}, labels ? labels[i] : v)));
    if (values.includes(current)) select.value = current;
  }

  function field(label, control) {
    return el("label", {class: "field"}, el("span", {}, label), control);
  }

  /* -- add queues (topic page) ----------------------------------------------------- */

  actions.addQueuesForm = function (section, topic) {
    const count = el("input", {type: "number", id: "add-queues-count", min: 1, max: 1024, value: 1});
    const broker = el("select", {id: "add-queues-broker"});
    const submit = el("button", {type: "submit", id: "add-queues-submit", class: "primary"}, "Add queues");
    const out = result("add-queues-result");
    const form = el("form", {class: "form-row", id: "add-queues-form"},
      field("Queues to add", count), field("On broker group", broker), submit, out);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      submit.disabled = true;
      const body = {count: Number(count.value)};
      if (broker.value) body.broker = broker.value;
      try {
        const reply = await EQ.api("/api/v1/topics/" + enc(topic) + "/queues", {json: body});
        report(out, true, topic + " now has " + reply.queue_count + " queues");
        EQ.refresh();
      } catch (error) {
        report(out, false, error.message);
      } finally {
        submit.disabled = false;
      }
    });
    section.body.append(form);
    section.node.eqFill = (t) => {
      const brokers = t.brokers.filter((b) => b);
      options(broker, ["", ...brokers], ["every broker group of the topic", ...brokers]);
      broker.disabled = brokers.length === 0;
    };
  };

  /* -- reset offsets (group page) ---------------------------------------------------- */

  actions.resetForm = function (section, group) {
    const topic = el("select", {id: "reset-topic"});
    const to = el("select", {id: "reset-to"},
      el("option", {value: "earliest"}, "earliest (read everything again)"),
      el("option", {value: "latest"}, "latest (skip the backlog)"),
      el("option", {value: "timestamp"}, "a time (UTC)"));
    const when = el("input", {type: "datetime-local", id: "reset-time", step: 1});
    const whenField = field("Time (UTC)", when);
    whenField.hidden = true;
    to.addEventListener("change", () => { whenField.hidden = to.value !== "timestamp"; });
    const broker = el("select", {id: "reset-broker"});
    const submit = el("button", {type: "button", id: "reset-submit", class: "primary"}, "Reset offsets");
    const out = result("reset-result");
    section.body.append(
      el("p", {class: "muted"}, "The brokers refuse while the group has live members: stop its consumers first."),
      el("form", {class: "form-row", id: "reset-form"}, field("Topic", topic), field("To", to),
        whenField, field("Broker group", broker), submit, out));
    armed(submit, "Reset offsets", () => "Click again: reset " + group + " on " + topic.value, async () => {
      const body = {topic: topic.value, to: to.value};
      if (to.value === "timestamp") {
        const ms = Date.parse(when.value + "Z");
        if (Number.isNaN(ms)) {
          report(out, false, "give the time to reset to");
          return;
        }
        body.to = {timestamp_ms: ms};
      }
      if (broker.value) body.broker = broker.value;
      try {
        const reply = await EQ.api("/api/v1/groups/" + enc(group) + "/reset", {json: body});
        report(out, true, "reset " + reply.topic + ": lag now " + EQ.fmtInt(reply.total_lag));
        EQ.refresh();
      } catch (error) {
        report(out, false, error.message);
      }
    });
    section.node.eqFill = (g) => {
      const topics = g.topics.map((t) => t.topic);
      options(topic, topics);
      const brokers = Array.from(new Set(g.queues.map((q) => q.broker).filter((b) => b))).sort();
      options(broker, ["", ...brokers], ["every broker group", ...brokers]);
    };
  };

  /* -- dead letters (group page) ------------------------------------------------------ */

  function header(message, name) {
    const h = (message.headers || []).find((x) => x.name === name);
    return h ? (h.text !== undefined ? h.text : h.hex) : "";
  }

  function preview(value) {
    if (!value) return EQ.dash;
    const text = value.text !== undefined ? value.text : "0x" + value.hex;
    return text.length > 80 ? text.slice(0, 80) + "\u2026" : text;
  }

  actions.deadLetters = async function (section, group, count) {
    const body = EQ.clear(section.body);
    if (!count) {
      body.append(el("p", {class: "muted", id: "dlq-empty"}, "no dead letters"));
      return;
    }
    let reply;
    try {
      reply = await EQ.api("/api/v1/groups/" + enc(group) + "/dlq?limit=100");
    } catch (error) {
      body.append(el("p", {class: "muted", id: "dlq-error"}, "dead letters not shown: " + error.message));
      return;
    }
    const boxes = [];
    const rows = reply.messages.map((m) => {
      const box = el("input", {type: "checkbox", value: m.id, class: "dlq-pick"});
      boxes.push(box);
      return el("tr", {dataset: {key: m.id}},
        el("td", {}, box),
        el("td", {dataset: {testid: "id", value: m.id}},
          EQ.link("/messages?id=" + enc(m.id), m.id)),
        EQ.txt("origin", header(m, "equeue.origin.topic") + " / " + header(m, "equeue.origin.queue") +
          " @ " + header(m, "equeue.origin.offset")),
        EQ.num("deliveries", Number(header(m, "equeue.deliveries")) || null),
        EQ.txt("error", header(m, "equeue.error") || header(m, "equeue.dlq.reason")),
        EQ.timeCell("stored", m.store_timestamp_ms),
        el("td", {class: "mono"}, preview(m.value)));
    });
    body.append(el("p", {class: "muted"}, "showing " + reply.messages.length + " of " +
      EQ.fmtInt(count) + " (the first 100)"));
    body.append(EQ.table("dlq", [
      {label: ""}, {label: "Id"}, {label: "Origin (topic / queue @ offset)"},
      {label: "Deliveries", num: true}, {label: "Last error"}, {label: "Dead since"}, {label: "Value"},
    ], rows));
    if (EQ.whoami && EQ.whoami.admin) body.append(dlqForm(group, boxes));
  };

  function dlqForm(group, boxes) {
    const out = result("dlq-result");
    const resend = el("button", {type: "button", id: "dlq-resend"}, "Resend selected");
    const resendAll = el("button", {type: "button", id: "dlq-resend-all"}, "Resend all");
    const confirm = el("input", {type: "text", id: "dlq-purge-confirm", placeholder: "type " + group + " to purge",
      autocomplete: "off"});
    const purge = el("button", {type: "button", id: "dlq-purge", class: "danger"}, "Purge all");
    const send = async (path, body, done) => {
      try {
        const reply = await EQ.api("/api/v1/groups/" + enc(group) + "/dlq/" + path, {json: body});
        report(out, true, done(reply));
        EQ.refresh();
      } catch (error) {
        report(out, false, error.message);
      }
    };
    resend.addEventListener("click", () => {
      const ids = boxes.filter((b) => b.checked).map((b) => b.value);
      if (!ids.length) return report(out, false, "select dead letters to resend");
      send("resend", {ids}, (r) => "resent " + r.resent + (r.already_resent ? ", " + r.already_resent + " already resent" : ""));
    });
    armed(resendAll, "Resend all", () => "Click again: resend every dead letter", () =>
      send("resend", {all: true}, (r) => "resent " + r.resent));
    purge.addEventListener("click", () => {
      if (confirm.value !== group) return report(out, false, "type the group's name to purge its dead letters");
      send("purge", {confirm: confirm.value}, (r) => "purged " + r.purged);
    });
    return el("div", {class: "form-row", id: "dlq-actions"}, resend, resendAll,
      el("span", {class: "spacer"}), confirm, purge, out);
  }
})(window.EQ);

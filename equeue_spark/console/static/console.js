/* equeue console: shared helpers (DOM building, formatting, the JSON API).
 *
 * No framework and no build step. Pages are built with createElement and
 * textContent only: topic names, keys and headers never become markup. Every
 * figure cell carries its raw number in data-value and a data-testid, so tests
 * compare exact values rather than formatted text. Styles are set through
 * element.style (the CSSOM), which the strict CSP allows, never as attributes.
 */
"use strict";

window.EQ = (function () {
  const EQ = {};

  /* -- DOM ------------------------------------------------------------------- */

  // el("td", {class: "num", dataset: {value: 3}}, "3", child, ...)
  EQ.el = function (tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "dataset") {
        for (const [k, v] of Object.entries(value)) {
          if (v !== undefined && v !== null) node.dataset[k] = String(v);
        }
      } else if (name === "on") {
        for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
      } else if (name === "class") {
        node.className = value;
      } else if (name === "text") {
        node.textContent = String(value);
      } else if (value === true) {
        node.setAttribute(name, "");
      } else {
        node.setAttribute(name, String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  };
  const el = EQ.el;

  EQ.clear = function (node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  };

  // A section: a titled card; returns {node, body}.
  EQ.section = function (title, id, extra) {
    const body = el("div", {class: "card-body", id: id ? id + "-body" : null});
    const head = el("div", {class: "card-head"}, el("h2", {}, title), extra || null);
    const node = el("section", {class: "card", id: id || null}, head, body);
    return {node, body, head};
  };

  /* -- formatting ------------------------------------------------------------- */

  EQ.dash = "\u2013";

  EQ.fmtInt = function (n) {
    if (n === null || n === undefined || Number.isNaN(n)) return EQ.dash;
    return Math.round(n).toLocaleString("en-US");
  };

  EQ.fmtRate = function (r) {
    if (r === null || r === undefined) return EQ.dash;
    if (r === 0) return "0";
    if (Math.abs(r) < 10) return r.toFixed(2);
    if (Math.abs(r) < 1000) return r.toFixed(1);
    return EQ.fmtInt(r);
  };

  EQ.fmtBytes = function (b) {
    if (b === null || b === undefined) return EQ.dash;
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let value = b;
    let i = 0;
    while (Math.abs(value) >= 1024 && i < units.length - 1) {
      value /= 1024;
      i += 1;
    }
    return (i === 0 ? String(value) : value.toFixed(value < 10 ? 2 : 1)) + " " + units[i];
  };

  EQ.fmtDuration = function (ms) {
    if (ms === null || ms === undefined) return EQ.dash;
    if (ms === 0) return "0";
    const s = ms / 1000;
    if (s < 1) return Math.round(ms) + " ms";
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min " + Math.floor(s % 60) + " s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + " h " + (m % 60) + " min";
    return Math.floor(h / 24) + " d " + (h % 24) + " h";
  };

  // UTC, second precision: the same on every operator's screen (the title
  // attribute gives the browser's local time).
  EQ.fmtTime = function (ms) {
    if (!ms) return EQ.dash;
    return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  };

  EQ.localTime = function (ms) {
    return ms ? new Date(ms).toLocaleString() : "";
  };

  /* -- cells ------------------------------------------------------------------- */

  // A number cell: raw value in data-value, formatted text shown.
  EQ.num = function (testid, value, format) {
    const shown = (format || EQ.fmtInt)(value);
    const raw = value === null || value === undefined ? "" : value;
    return el("td", {class: "num", dataset: {testid, value: raw}}, shown);
  };

  EQ.txt = function (testid, value, attrs) {
    return el("td", Object.assign({dataset: {testid, value}}, attrs || {}), value);
  };

  EQ.timeCell = function (testid, ms) {
    return el("td", {class: "time", dataset: {testid, value: ms}, title: EQ.localTime(ms)},
      EQ.fmtTime(ms));
  };

  EQ.badge = function (state, text) {
    return el("span", {class: "badge badge-" + state, dataset: {state}}, text || state);
  };

  EQ.link = function (href, text) {
    return el("a", {href}, text);
  };

  // A table: columns [{label, num?, title?}], rows = <tr> nodes.
  EQ.table = function (id, columns, rows, empty) {
    const head = el("tr", {}, columns.map((c) =>
      el("th", {class: c.num ? "num" : null, title: c.title || null}, c.label)));
    const body = el("tbody", {}, rows);
    if (!rows.length) {
      body.append(el("tr", {class: "empty"},
        el("td", {colspan: columns.length}, empty || "nothing to show")));
    }
    return el("div", {class: "table-wrap"},
      el("table", {id, class: "grid"}, el("thead", {}, head), body));
  };

  EQ.stat = function (testid, label, value, format, note) {
    const raw = value === null || value === undefined ? "" : value;
    return el("div", {class: "stat"},
      el("div", {class: "stat-label"}, label),
      el("div", {class: "stat-value", dataset: {testid, value: raw}}, (format || EQ.fmtInt)(value)),
      note ? el("div", {class: "stat-note"}, note) : null);
  };

  /* -- the JSON API --------------------------------------------------------------- */

  EQ.ApiError = class extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  };

  EQ.api = async function (path, options) {
    const init = Object.assign({credentials: "same-origin", headers: {}}, options || {});
    if (init.json !== undefined) {
      init.method = init.method || "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(init.json);
      delete init.json;
    }
    const response = await fetch(path, init);
    const type = response.headers.get("Content-Type") || "";
    const body = type.startsWith("application/json") ? await response.json() : await response.text();
    if (!response.ok) {
      const message = body && body.error ? body.error : "HTTP " + response.status;
      throw new EQ.ApiError(response.status, message);
    }
    return body;
  };

  EQ.query = function (params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
      else if (v !== undefined && v !== null && v !== "") q.append(k, v);
    }
    const s = q.toString();
    return s ? "?" + s : "";
  };

  /* -- the page-wide banner (stale, partial, errors) ---------------------------- */

  // header: the round header of a reply ({round, at_ms, errors, stale});
  // extra: more reasons ("partial: b not answering").
  EQ.showHealth = function (header, extra) {
    const banner = document.getElementById("banner");
    const lines = [];
    const stale = (header && header.stale) || [];
    if (stale.length) lines.push("stale: " + stale.join(", ") + " (last known figures shown)");
    for (const e of (header && header.errors) || []) lines.push(e);
    for (const e of extra || []) lines.push(e);
    EQ.clear(banner);
    banner.hidden = lines.length === 0;
    banner.dataset.state = stale.length || (extra && extra.length) ? "partial" : "ok";
    for (const line of lines) banner.append(el("div", {}, line));
  };

  EQ.showError = function (message) {
    const banner = document.getElementById("banner");
    EQ.clear(banner);
    banner.hidden = false;
    banner.dataset.state = "error";
    banner.append(el("div", {}, message));
  };

  return EQ;
})();

/* equeue console: start-up. Reads the page from the shell (<body
 * data-page data-arg>), asks who the user is, builds the page, then follows
 * the poll rounds by server-sent events (/api/v1/events): each round
 * refetches the page's JSON and the plots' new points. When a round is
 * applied, document.body.dataset.round says which (tests wait on it).
 */
"use strict";

(function (EQ) {
  const el = EQ.el;
  const body = document.body;
  const main = document.getElementById("main");
  let page = null;
  let running = false;
  let again = false;
  let lastEvent = null;

  function setRound(round) {
    if (typeof round === "number" && round >= 0) body.dataset.round = String(round);
  }

  // One update at a time; a round that arrives meanwhile runs once after it.
  EQ.refresh = async function () {
    if (!page) return;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      const round = await page.update();
      setRound(round === null || round === undefined ? (lastEvent && lastEvent.round) : round);
      body.dataset.updated = String(Date.now());
    } catch (error) {
      if (error instanceof EQ.ApiError && error.status === 401) {
        EQ.showError("log in to see the figures");
        location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
        return;
      }
      EQ.showError(error instanceof EQ.ApiError && error.status === 404 ? error.message
        : "could not update: " + error.message);
      setRound(lastEvent && lastEvent.round);
    } finally {
      running = false;
      if (again) {
        again = false;
        EQ.refresh();
      }
    }
  };

  // The event stream holds one of the browser's 6 connections to the console:
  // closed when the page is left (else pages kept in the back/forward cache
  // hold theirs and, past 6, new pages wait for a free connection), reopened
  // when it is shown again.
  function live() {
    let events = follow();
    window.addEventListener("pagehide", () => events.close());
    window.addEventListener("pageshow", (event) => {
      if (event.persisted) {
        events = follow();
        EQ.refresh();
      }
    });
  }

  function follow() {
    const badge = document.getElementById("live");
    const events = new EventSource("/api/v1/events");
    events.addEventListener("open", () => {
      badge.dataset.state = "live";
      badge.textContent = "live";
    });
    events.addEventListener("error", () => {
      badge.dataset.state = "reconnecting";
      badge.textContent = "reconnecting\u2026";
    });
    events.addEventListener("round", (event) => {
      lastEvent = JSON.parse(event.data);
      badge.dataset.state = "live";
      badge.textContent = "live \u00b7 round " + lastEvent.round + " \u00b7 " +
        EQ.fmtTime(lastEvent.at_ms).slice(11);
      badge.title = "last poll round at " + EQ.localTime(lastEvent.at_ms);
      EQ.refresh();
    });
    return events;
  }

  // A console that stops answering: say how old the figures are.
  function watchAge() {
    const badge = document.getElementById("live");
    setInterval(() => {
      if (!lastEvent) return;
      const age = Date.now() - lastEvent.at_ms;
      if (age > 30000) {
        badge.dataset.state = "stale";
        badge.textContent = "stale \u00b7 " + EQ.fmtDuration(age) + " old";
      }
    }, 5000);
  }

  function session(who) {
    const node = document.getElementById("whoami");
    EQ.clear(node);
    if (who.user) {
      node.dataset.user = who.user;
      node.dataset.admin = String(who.admin);
      const logout = el("button", {type: "button", id: "logout", class: "link"}, "log out");
      logout.addEventListener("click", async () => {
        await EQ.api("/api/v1/logout", {json: {}}).catch(() => {});
        location.assign("/login");
      });
      node.append(el("span", {class: "user"}, who.user),
        el("span", {class: "role"}, who.admin ? "admin" : who.roles.join(", ")), logout);
    } else if (who.tokens) {
      node.append(el("a", {href: "/login", id: "login-link"}, "log in"));
    } else {
      node.append(el("span", {class: "role", title: "started without --tokens-file"}, "read-only console"));
    }
  }

  function loginPage(who) {
    const card = EQ.section("Log in", "login-card");
    card.node.classList.add("narrow");
    if (!who.tokens) {
      card.body.append(el("p", {id: "login-none"},
        "This console has no users (no --tokens-file): every page is open and read-only."));
      main.append(card.node);
      return;
    }
    const token = el("input", {type: "password", id: "login-token", autocomplete: "current-password",
      placeholder: "token secret", required: true});
    const submit = el("button", {type: "submit", id: "login-submit", class: "primary"}, "Log in");
    const error = el("div", {class: "result", id: "login-error", dataset: {state: "error"}});
    const form = el("form", {class: "form-stack", id: "login-form"},
      el("label", {class: "field"}, el("span", {}, "Token"), token), submit, error);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      error.textContent = "";
      try {
        const reply = await EQ.api("/api/v1/login", {json: {token: token.value}});
        session({user: reply.user, roles: reply.roles, admin: reply.admin, tokens: true});
        const next = new URLSearchParams(location.search).get("next");
        location.assign(next && next.startsWith("/") && !next.startsWith("//") ? next : "/");
      } catch (failure) {
        error.textContent = failure.message;
      }
    });
    card.body.append(el("p", {class: "muted"},
      "A token from the console's tokens file. Admin tokens may also act (reset offsets, " +
      "resend dead letters, add queues); the others only read."), form);
    if (who.user) card.body.append(el("p", {}, "Logged in as " + who.user + "."));
    main.append(card.node);
    token.focus();
  }

  async function start() {
    const name = body.dataset.page || "cluster";
    const arg = body.dataset.arg || "";
    for (const a of document.querySelectorAll("#nav a")) {
      if (a.dataset.nav === name) a.classList.add("active");
    }
    let who = {tokens: false, user: null, roles: [], admin: false};
    try {
      who = await EQ.api("/api/v1/whoami");
    } catch (error) {
      EQ.showError("the console does not answer: " + error.message);
    }
    EQ.whoami = who;
    session(who);
    EQ.clear(main);
    if (name === "login") {
      loginPage(who);
      return;
    }
    const impl = EQ.pages[name];
    if (!impl) {
      main.append(el("p", {}, "no such page: " + name));
      return;
    }
    if (who.tokens && !who.user) {
      location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
      return;
    }
    document.title = (arg || impl.title) + " \u00b7 equeue console";
    if (arg) {
      main.append(el("div", {class: "crumbs"}, EQ.link("/" + name, impl.title), " / ", arg));
    }
    main.append(el("h1", {class: "page-title"}, arg || impl.title));
    impl.build(main, arg);
    page = impl;
    await EQ.refresh();
    live();
    watchAge();
  }

  start();
})(window.EQ);

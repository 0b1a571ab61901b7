// env-connect.js: the environment page's connection states.
//  - [data-poll]: after a host is added, ask its state every 2 s and show
//    it until agentd answers (healthy or degraded), for up to 15 minutes.
//  - form[data-test-connection]: Test connection runs in place, showing
//    progress with the button disabled, then the outcome coloured by state.
(function () {
  "use strict";
  if (window.ghEnvConnect) return; // included by more than one section
  window.ghEnvConnect = true;

  var states = ["pending", "healthy", "degraded", "unreachable", "unknown"];

  function show(el, state, msg) {
    states.forEach(function (s) { el.classList.remove("outcome-" + s); });
    el.classList.add("outcome", "outcome-" + state);
    el.setAttribute("data-state", state);
    el.textContent = msg;
    el.hidden = false;
  }

  // The facts list's "Last checked" follows the latest answer too.
  function checked(h) {
    var c = document.querySelector('dl.facts [data-testid="last-checked"]');
    if (c && h && h.checked) c.textContent = h.checked;
  }

  // The facts list's health badge follows the latest answer.
  function badge(status) {
    var b = document.querySelector('dl.facts [data-testid="status"]');
    if (!b || !status) return;
    states.forEach(function (s) { b.classList.remove("badge-" + s); });
    b.classList.add("badge-" + status);
    b.textContent = status;
  }

  function ask(url, opts) {
    opts = opts || {};
    opts.credentials = "same-origin";
    opts.headers = { Accept: "application/json" };
    return fetch(url, opts).then(function (r) {
      return r.json().then(function (body) {
        if (!r.ok) throw new Error((body.error && body.error.message) || ("The console answered " + r.status + "."));
        return body;
      });
    });
  }

  function poll(el) {
    var url = el.getAttribute("data-poll"), tries = 0, until = Date.now() + 15 * 60 * 1000;
    var waiting = el.textContent.trim();
    function next() {
      if (Date.now() > until) {
        show(el, "unreachable", "agentd has not answered for 15 minutes. Check the command ran on the host and that the console can reach it, then use Test connection.");
        return;
      }
      tries++;
      ask(url).then(function (h) {
        badge(h.status);
        checked(h);
        if (h.status === "healthy" || h.status === "degraded") {
          show(el, h.status, h.message);
          return;
        }
        show(el, "pending", waiting + " (checked " + tries + (tries === 1 ? " time" : " times") + "; last answer: " + h.message + ")");
        setTimeout(next, 2000);
      }, function (err) {
        show(el, "pending", waiting + " (" + err.message + ")");
        setTimeout(next, 4000);
      });
    }
    next();
  }

  function testButton(form) {
    var btn = form.querySelector("button[type=submit]");
    var out = document.querySelector('[data-testid="test-result"]');
    if (!btn || !out) return;
    var label = btn.textContent;
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      btn.disabled = true;
      btn.setAttribute("aria-busy", "true");
      btn.textContent = "Testing…";
      show(out, "pending", "Testing the connection (up to 10 s)…");
      ask(form.action, { method: "POST", body: new URLSearchParams(new FormData(form)) }).then(function (h) {
        show(out, h.status, h.message);
        badge(h.status);
        checked(h);
      }, function (err) {
        show(out, "unreachable", err.message);
      }).then(function () {
        btn.disabled = false;
        btn.removeAttribute("aria-busy");
        btn.textContent = label;
      });
    });
  }

  function start() {
    document.querySelectorAll("[data-poll]").forEach(poll);
    document.querySelectorAll("form[data-test-connection]").forEach(testButton);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

// session-live.js: a session's page follows the session without a reload.
// Its live parts ([data-live] with an id: the facts, the actions, the
// command list) are fetched again from the page's own address every few
// seconds while the page is visible, and soon after each terminal event
// (attached, a command line entered, the end), and replaced when
// they changed. Nothing is fetched once the session is closed or lost, nor
// once the page can no longer be read as itself: a refusal (access
// removed: each refused read is an audited denial, and a tab left open
// would write one every few seconds for ever) or a redirect (signed out).
// document.body.dataset.live then says "stopped".
(function () {
  "use strict";
  if (window.ghSessionLive) return;
  window.ghSessionLive = true;

  var EVERY = 3000, SOON = 400;
  var timer = null, due = 0, busy = false, again = false, done = false;

  function final(doc) {
    var st = doc.querySelector('[data-testid="session-state"]');
    var s = st ? st.textContent.trim() : "";
    return s === "closed" || s === "lost";
  }

  function stop() {
    done = true;
    if (timer !== null) clearTimeout(timer);
    timer = null;
    document.body.dataset.live = "stopped";
  }

  // last holds each live part's markup as the server last sent it: the
  // page's own scripts change the markup in place (tables.js), which is
  // no reason to replace it.
  var last = new WeakMap();

  function swap(doc) {
    document.querySelectorAll("[data-live][id]").forEach(function (el) {
      var fresh = doc.getElementById(el.id);
      if (!fresh) return;
      var html = fresh.innerHTML;
      if (html === (last.has(el) ? last.get(el) : el.innerHTML)) return;
      // A dialog being filled in (Close session…) is not pulled away.
      if (el.contains(document.activeElement) && document.activeElement !== document.body) return;
      if (el.querySelector("dialog[open], details[open]")) return;
      el.innerHTML = html;
      last.set(el, html);
    });
  }

  function refresh() {
    timer = null;
    if (done) return;
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(location.pathname, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) {
        if (r.redirected || (r.status >= 400 && r.status < 500 && r.status !== 408 && r.status !== 429)) {
          stop();
          return null;
        }
        if (!r.ok) throw new Error(String(r.status));
        return r.text();
      })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        swap(doc);
        if (final(doc)) stop();
      })
      .catch(function () { /* the next round tries again */ })
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          schedule(SOON);
        } else {
          schedule(EVERY);
        }
      });
  }

  function schedule(ms) {
    if (done) return;
    if (timer !== null) {
      if (due <= Date.now() + ms) return; // one is due sooner already
      clearTimeout(timer);
    }
    due = Date.now() + ms;
    timer = setTimeout(function () {
      if (document.hidden) {
        timer = null;
        schedule(EVERY);
        return;
      }
      refresh();
    }, ms);
  }

  document.addEventListener("gatehouse:terminal", function () { schedule(SOON); });
  document.addEventListener("visibilitychange", function () { if (!document.hidden) schedule(SOON); });
  schedule(EVERY);
})();

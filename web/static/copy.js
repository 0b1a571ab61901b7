// copy.js: a button with data-copy="<id>" copies the text of the element
// with that id (a sign-in address, a command), and says so next to itself.
// Without clipboard access (plain http on another host, a refused
// permission) the text is selected instead, with a hint to press Ctrl+C.
(function () {
  "use strict";
  if (window.ghCopy) return; // included once per copyable value
  window.ghCopy = true;

  function say(btn, msg) {
    var s = btn.parentElement.querySelector(".copy-done");
    if (s) s.textContent = msg;
  }

  function selectText(el) {
    var r = document.createRange();
    r.selectNodeContents(el);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(r);
  }

  function fallback(btn, el) {
    selectText(el);
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    say(btn, ok ? "Copied" : "Selected: press Ctrl+C (⌘C on a Mac) to copy");
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("button[data-copy]");
    if (!btn) return;
    var el = document.getElementById(btn.getAttribute("data-copy"));
    if (!el) return;
    var text = el.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { say(btn, "Copied"); }, function () { fallback(btn, el); });
    } else {
      fallback(btn, el);
    }
  });
})();

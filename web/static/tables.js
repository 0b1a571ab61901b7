// Tables that read on a phone and never break a short word. Every table in
// a page's main part (not one marked no-cards) becomes cards below 760 px (fit.css), each cell labelled by its
// column's header. In a cell, a long token (an email, a path, a dotted
// name) may wrap after its punctuation (<wbr>, which copying ignores);
// only a run too long for any column (a hash) is marked breakable and may
// break anywhere. Numbers, states and short labels stay whole. Rows added
// later (live pages) are handled as they come. Without JavaScript tables
// scroll in their own box instead.
(function () {
  "use strict";
  var HAS_LONG_TOKEN = /[^\s]{13,}/;
  var LONG_RUN = /[^\s\/.@_:=,&?-]{22,}/;
  // soften puts a <wbr> after the punctuation of each long token in the
  // text nodes of el (not in pre or textarea).
  function soften(el) {
    var walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT, {
      acceptNode: function (n) {
        return n.parentElement.closest("pre, textarea, script, style") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT;
      }
    });
    var nodes = [];
    for (var n = walk.nextNode(); n; n = walk.nextNode()) {
      if (!softened.has(n) && HAS_LONG_TOKEN.test(n.data)) nodes.push(n);
    }
    nodes.forEach(function (node) {
      softened.add(node);
      var parts = node.data.split(/([\/.@_:=,&?-])/);
      var frag = document.createDocumentFragment();
      var run = "", breaks = 0;
      for (var i = 0; i < parts.length; i++) {
        run += parts[i];
        if (i % 2 === 1 && parts.slice(i + 1).join("") !== "" && !/\s$/.test(run)) {
          frag.appendChild(text(run));
          frag.appendChild(document.createElement("wbr"));
          run = "";
          breaks++;
        }
      }
      if (breaks === 0) return;
      if (run) frag.appendChild(text(run));
      node.parentNode.replaceChild(frag, node);
    });
  }
  // softened holds the text nodes already split, so a page's later
  // changes never split them again.
  var softened = new WeakSet();
  function text(s) {
    var t = document.createTextNode(s);
    softened.add(t);
    return t;
  }
  function cell(td) {
    var t = td.textContent;
    if (LONG_RUN.test(t)) td.classList.add("breakable");
    if (HAS_LONG_TOKEN.test(t)) soften(td);
  }
  function label(table) {
    if (table.classList.contains("no-cards")) return;
    table.classList.add("cards");
    var heads = [];
    var row = table.tHead && table.tHead.rows[0];
    if (row) {
      for (var i = 0; i < row.cells.length; i++) {
        var span = row.cells[i].colSpan || 1;
        for (var j = 0; j < span; j++) heads.push(row.cells[i].textContent.trim());
      }
    }
    for (var b = 0; b < table.tBodies.length; b++) {
      var rows = table.tBodies[b].rows;
      for (var r = 0; r < rows.length; r++) {
        var col = 0;
        for (var c = 0; c < rows[r].cells.length; c++) {
          var td = rows[r].cells[c];
          if (td.tagName === "TD" && !td.hasAttribute("data-label") && heads[col]) td.setAttribute("data-label", heads[col]);
          cell(td);
          col += td.colSpan || 1;
        }
      }
    }
  }
  var main = document.getElementById("main");
  if (!main) return;
  function all() { main.querySelectorAll("table").forEach(label); }
  all();
  if (window.MutationObserver) {
    var pending = false;
    new MutationObserver(function () {
      if (pending) return;
      pending = true;
      requestAnimationFrame(function () { pending = false; all(); });
    }).observe(main, { childList: true, subtree: true });
  }
})();

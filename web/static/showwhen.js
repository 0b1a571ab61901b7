// Dependent fields: an element with data-show-when="NAME=V1,V2" is shown
// only while its form's control NAME (a select or radio group) holds one
// of the values; hidden, its fields are disabled so they are not sent.
// Without JavaScript every such element stays visible, labelled with what
// it needs.
(function () {
  "use strict";
  document.querySelectorAll("[data-show-when]").forEach(function (el) {
    var form = el.closest("form");
    var spec = el.getAttribute("data-show-when");
    var eq = spec.indexOf("=");
    var name = spec.slice(0, eq);
    var values = spec.slice(eq + 1).split(",");
    if (!form) return;
    function current() {
      var ctl = form.elements.namedItem(name);
      if (!ctl) return "";
      if (ctl.tagName === "SELECT") return ctl.value;
      if (ctl.value !== undefined && ctl.length === undefined) {
        return ctl.checked || ctl.type !== "radio" ? ctl.value : "";
      }
      for (var i = 0; i < ctl.length; i++) {
        if (ctl[i].checked) return ctl[i].value;
      }
      return "";
    }
    function sync() {
      var on = values.indexOf(current()) >= 0;
      el.hidden = !on;
      el.querySelectorAll("input, select, textarea").forEach(function (f) {
        f.disabled = !on;
      });
    }
    form.addEventListener("change", sync);
    sync();
  });
})();

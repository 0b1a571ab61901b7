// Environment forms: show only the chosen kind's settings. Without
// JavaScript both sections stay visible, each labelled with its kind.
(function () {
  "use strict";
  document.querySelectorAll("select[data-kind-switch]").forEach(function (sel) {
    var form = sel.form;
    function sync() {
      form.querySelectorAll("fieldset[data-kind]").forEach(function (fs) {
        var on = fs.getAttribute("data-kind") === sel.value;
        fs.hidden = !on;
        // A hidden section's fields are not sent, so a stale value of the
        // other kind cannot be refused.
        fs.disabled = !on;
      });
    }
    sel.addEventListener("change", sync);
    sync();
  });
})();

// New organization form: suggest the slug from the display name until the
// person edits the slug themselves. Without JavaScript the slug is typed.
(function () {
  "use strict";
  var name = document.getElementById("name");
  var slug = document.getElementById("slug");
  if (!name || !slug || !slug.hasAttribute("data-suggest")) {
    return;
  }
  var edited = slug.value !== "";
  slug.addEventListener("input", function () {
    edited = slug.value !== "";
  });
  name.addEventListener("input", function () {
    if (edited) {
      return;
    }
    slug.value = name.value
      .normalize("NFKD")
      .replace(/[\u0300-\u036f]/g, "")
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, "-")
      .replace(/^-+|-+$/g, "")
      .slice(0, 40)
      .replace(/-+$/, "");
  });
})();

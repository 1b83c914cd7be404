// OpenRelay dashboard: the few behaviours htmx does not give. No inline handlers anywhere (the CSP forbids them).
(function () {
  "use strict";

  // Live regions (data-live) poll only while the tab is visible: a poll that comes due while it is hidden waits
  // and goes out once the tab is shown again. The server stops a region's polling once its batches are terminal.
  document.addEventListener("htmx:confirm", function (evt) {
    var el = evt.detail && evt.detail.elt;
    if (!el || !el.hasAttribute("data-live") || !document.hidden) return;
    evt.preventDefault();
    var resume = function () {
      if (document.hidden) return;
      document.removeEventListener("visibilitychange", resume);
      evt.detail.issueRequest(true);
    };
    document.addEventListener("visibilitychange", resume);
  });

  // Forms that change something irreversible ask first.
  document.addEventListener("submit", function (evt) {
    var form = evt.target;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      evt.preventDefault();
      return;
    }
    if (form.hasAttribute("data-once")) {
      // The Idempotency-Key already makes a double submit one batch; this spares the second request too.
      if (form.dataset.sent) { evt.preventDefault(); return; }
      form.dataset.sent = "1";
    }
  });

  // Copy buttons.
  document.addEventListener("click", function (evt) {
    var button = evt.target.closest && evt.target.closest("[data-copy]");
    if (!button) return;
    var text = button.getAttribute("data-copy");
    var done = function () { button.textContent = "Copied"; setTimeout(function () { button.textContent = "Copy"; }, 1500); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () {});
    } else {
      var area = document.createElement("textarea");
      area.value = text; document.body.appendChild(area); area.select();
      try { document.execCommand("copy"); done(); } catch (e) { /* nothing to do */ }
      area.remove();
    }
  });

  // Drag and drop onto the upload field.
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-dropzone]").forEach(function (zone) {
      var input = zone.querySelector("input[type=file]");
      var label = zone.querySelector("span");
      var show = function () { if (input.files.length) label.textContent = input.files[0].name; };
      input.addEventListener("change", show);
      ["dragenter", "dragover"].forEach(function (name) {
        zone.addEventListener(name, function (e) { e.preventDefault(); zone.classList.add("over"); });
      });
      ["dragleave", "drop"].forEach(function (name) {
        zone.addEventListener(name, function () { zone.classList.remove("over"); });
      });
      zone.addEventListener("drop", function (e) {
        e.preventDefault();
        if (e.dataTransfer && e.dataTransfer.files.length) { input.files = e.dataTransfer.files; show(); }
      });
    });
  });
})();

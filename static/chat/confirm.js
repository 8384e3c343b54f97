// Forms that ask before they submit (data-confirm="question"): a listener, not an inline handler, so the
// Content-Security-Policy can forbid inline script on every page.
(function () {
  "use strict";
  document.addEventListener("submit", function (e) {
    const form = e.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      e.preventDefault();
    }
  });
})();

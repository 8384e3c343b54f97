// The staff's live chat: re-read the transcript every few seconds and swap it in when it changed, keeping the
// newest message in view when the page was already at the bottom. (No inline script: the pages run under CSP.)
(function () {
  "use strict";
  const live = document.getElementById("live");
  const box = document.getElementById("live-transcript");
  if (!live || !box) return;
  const url = live.dataset.transcript;
  let last = box.innerHTML;
  let busy = false;

  function atBottom() {
    return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 40;
  }

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      // Signed out meanwhile: the read was sent to the sign-in page. Draw the page again (it asks to sign in).
      if (response.redirected) { window.location.reload(); return; }
      if (!response.ok) return;
      const html = await response.text();
      if (html !== last) {
        const follow = atBottom();
        const before = box.querySelector(".live-turns");
        const statusBefore = before ? before.dataset.status : "";
        box.innerHTML = html;
        last = html;
        const after = box.querySelector(".live-turns");
        // The controls depend on who has the chat: when that changed elsewhere, draw the page again.
        if (after && statusBefore && after.dataset.status !== statusBefore) { window.location.reload(); return; }
        if (follow) box.lastElementChild.scrollIntoView({ block: "end" });
      }
    } catch (e) {
      // A failed read (a restart, the network) is tried again at the next tick.
    } finally {
      busy = false;
    }
  }

  box.lastElementChild && box.lastElementChild.scrollIntoView({ block: "end" });
  window.setInterval(refresh, 2000);
})();

// Branches in the chat page: edit a message you sent, regenerate a reply, move between the versions (‹ 1/2 ›).
// Editing and regenerating both branch the chat at that turn (POST /chats/<id>/fork/): the new branch has the
// turns before it, in the state before it; this page then opens the branch and sends the message there (the
// edited one, or the same one again) through the page's own composer, so it streams like any message.
// The original stays as it was, one version away. Other tabs follow the move (the "branch" event, chat.js).
(function () {
  "use strict";
  const form = document.getElementById("composer");
  const turns = document.getElementById("turns");
  if (!form || !turns) return;
  const input = document.getElementById("message");
  const send = document.getElementById("send");
  const errorBox = document.getElementById("chat-error");
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  const forkUrl = form.dataset.forkUrl;
  const PENDING = "chat-send:";

  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = false;
  }

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf },
      body: JSON.stringify(body || {}),
    });
    let data = {};
    try { data = await response.json(); } catch (_) { /* not JSON */ }
    if (!response.ok) throw new Error((data.error && data.error.message) || "The request failed (" + response.status + ").");
    return data;
  }

  // Branch at the turn and send ``message`` on the new branch (after the page has moved there).
  async function branchAndSend(turnId, message) {
    if (send.disabled) return;
    errorBox.hidden = true;
    // Until this page has moved, the chat's own "branch" event (the fork signals every page) is this tab's to act on.
    form.dataset.forking = "1";
    try {
      const branch = await post(forkUrl, { turn_id: Number(turnId) });
      sessionStorage.setItem(PENDING + branch.session_id, message);
      location.assign(branch.url);
    } catch (err) {
      form.dataset.forking = "";
      showError(err.message);
    }
  }

  function userOf(reply) {
    return turns.querySelector('li.msg.user[data-turn="' + Number(reply.dataset.turn) + '"]');
  }
  function finished(reply) {
    if (!reply || !reply.dataset.turn || reply.classList.contains("streaming")) return false;
    return reply.dataset.done === "1" || reply.dataset.running !== "1";
  }

  function actions(li) {
    let box = li.querySelector(":scope > .turn-actions");
    if (!box) {
      box = document.createElement("div");
      box.className = "turn-actions";
      li.appendChild(box);
    }
    return box;
  }

  function button(label, className) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "link " + className;
    b.textContent = label;
    return b;
  }

  // How far the end of ``li`` is below the top of the composer (which stays stuck to the window's bottom).
  function belowComposer(li) {
    return li ? li.getBoundingClientRect().bottom - (form.getBoundingClientRect().top - 8) : 0;
  }

  // Edit under each message, Regenerate under each reply, once its turn has finished. The newest message, in view
  // above the composer before its buttons came (the chat opens there; a reply just finished), stays in view.
  function decorate() {
    if (!forkUrl) return;
    const newest = turns.lastElementChild;
    const inView = belowComposer(newest) <= 1;
    addButtons();
    const over = belowComposer(newest);
    if (inView && over > 0) window.scrollBy(0, over);
  }

  function addButtons() {
    turns.querySelectorAll("li.msg.assistant[data-turn]").forEach(function (reply) {
      if (!finished(reply) || reply.querySelector(".regenerate")) return;
      const mine = userOf(reply);
      if (!mine) return;
      const nav = reply.querySelector(":scope > nav.versions");
      const box = actions(reply);
      if (nav) box.appendChild(nav);
      box.appendChild(button("Regenerate", "regenerate"));
      if (!mine.querySelector(".edit-message")) actions(mine).appendChild(button("Edit", "edit-message"));
    });
  }

  function startEdit(mine) {
    if (mine.querySelector("form.edit")) return;
    const bubble = mine.querySelector(".bubble");
    const edit = document.createElement("form");
    edit.className = "edit";
    const label = document.createElement("label");
    label.className = "visually-hidden";
    label.textContent = "Edit your message";
    const area = document.createElement("textarea");
    area.name = "edited";
    area.rows = 3;
    area.value = bubble.innerText;
    area.id = "edit-" + Number(mine.dataset.turn);
    label.htmlFor = area.id;
    const save = button("Save and send", "save-edit");
    save.type = "submit";
    save.className = "save-edit";
    const cancel = button("Cancel", "cancel-edit");
    const row = document.createElement("div");
    row.className = "edit-buttons";
    row.append(cancel, save);
    edit.append(label, area, row);
    bubble.hidden = true;
    mine.querySelector(".turn-actions").hidden = true;
    bubble.after(edit);
    area.focus();
    cancel.addEventListener("click", function () {
      edit.remove();
      bubble.hidden = false;
      mine.querySelector(".turn-actions").hidden = false;
    });
    edit.addEventListener("submit", function (e) {
      e.preventDefault();
      if (!area.value.trim()) return;
      save.disabled = true;
      branchAndSend(mine.dataset.turn, area.value).finally(function () { save.disabled = false; });
    });
  }

  turns.addEventListener("click", function (e) {
    const target = e.target;
    if (!(target instanceof HTMLElement)) return;
    if (target.classList.contains("edit-message")) {
      startEdit(target.closest("li.msg.user"));
    } else if (target.classList.contains("regenerate")) {
      const reply = target.closest("li.msg.assistant");
      const mine = userOf(reply);
      if (mine) branchAndSend(reply.dataset.turn, mine.querySelector(".bubble").innerText);
    } else if (target.matches("nav.versions a[data-switch-url]")) {
      // Moving to another version moves the chat there: every open tab follows.
      e.preventDefault();
      post(target.dataset.switchUrl).then(function (data) { location.assign(data.url); }, function (err) { showError(err.message); });
    }
  });

  decorate();
  new MutationObserver(decorate).observe(turns, { subtree: true, childList: true, attributes: true, attributeFilter: ["data-done", "class"] });

  // Opened to send a message here (an edit or a regenerate made this branch): send it as if typed.
  const pending = sessionStorage.getItem(PENDING + form.dataset.session);
  if (pending !== null) {
    sessionStorage.removeItem(PENDING + form.dataset.session);
    input.value = pending;
    form.requestSubmit();
  }
})();

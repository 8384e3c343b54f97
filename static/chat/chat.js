// The chat page: post a message, read the reply as server-sent events from a fetch() body, show the
// deltas as text (textContent: nothing the model writes is ever parsed as HTML), then swap in the
// server-rendered, sanitized HTML at "done" and refresh the side panels.
(function () {
  "use strict";
  // A long message (a pasted 20,000-character text) is drawn a few lines high with "Show all" under it; it was
  // drawn at full height, pages of it between one reply and the next. Messages from the user and from staff.
  function clampLong(li) {
    const body = li && li.querySelector(".bubble");
    if (!body || li.querySelector(".expand")) return;
    body.classList.add("clamped");
    if (body.scrollHeight <= body.clientHeight + 1) {
      body.classList.remove("clamped");
      return;
    }
    const toggle = document.createElement("button");
    toggle.type = "button";
    toggle.className = "link expand";
    toggle.textContent = "Show all";
    toggle.setAttribute("aria-expanded", "false");
    toggle.addEventListener("click", function () {
      const open = body.classList.toggle("expanded");
      toggle.textContent = open ? "Show less" : "Show all";
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
    });
    body.after(toggle);
  }
  document.querySelectorAll("#turns li.msg.user, #turns li.msg.staff").forEach(clampLong);

  const form = document.getElementById("composer");
  if (!form) return;
  const input = document.getElementById("message");
  const send = document.getElementById("send");
  const turns = document.getElementById("turns");
  const errorBox = document.getElementById("chat-error");
  const panels = document.getElementById("panels");
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;

  function newKey() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return Date.now().toString(36) + Math.random().toString(36).slice(2);
  }

  // Scroll so that the end of ``li`` sits just above the composer, which stays stuck to the bottom of the
  // window (scrollIntoView put it behind the composer).
  function reveal(li) {
    if (!li) return;
    const box = li.getBoundingClientRect();
    const floor = form.getBoundingClientRect().top - 8;
    if (box.bottom > floor) window.scrollBy(0, box.bottom - floor);
    else if (box.top < 0) window.scrollBy(0, box.top - 8);
  }

  function bubble(role, text) {
    const li = document.createElement("li");
    li.className = "msg " + role;
    const div = document.createElement("div");
    div.className = "bubble";
    div.textContent = text;
    li.appendChild(div);
    turns.appendChild(li);
    if (role !== "assistant") clampLong(li);
    reveal(li);
    return li;
  }

  // From send to the first token: three dots that say a reply is being written.
  function typing(reply) {
    const dots = document.createElement("span");
    dots.className = "typing";
    dots.setAttribute("role", "status");
    dots.setAttribute("aria-label", "Writing a reply");
    for (let i = 0; i < 3; i++) dots.appendChild(document.createElement("span"));
    reply.querySelector(".bubble").appendChild(dots);
  }

  function note(li, text) {
    const p = document.createElement("p");
    p.className = "cut-note";
    p.textContent = text;
    li.appendChild(p);
  }

  function showError(message, link) {
    errorBox.textContent = message;
    if (link) {
      const a = document.createElement("a");
      a.href = link.href;
      a.target = "_blank";
      a.rel = "noopener";
      a.textContent = link.text;
      errorBox.append(" ", a);
    }
    errorBox.hidden = false;
    reveal(errorBox);
  }

  const EXPIRED = "Your sign-in has expired. Your message is kept here: sign in again, then send it.";
  function showExpired(loginUrl) {
    showError(EXPIRED, { href: loginUrl || "/accounts/login/?next=" + encodeURIComponent(location.pathname), text: "Sign in (opens a new tab)" });
  }

  async function refreshPanels() {
    const response = await fetch(form.dataset.panelsUrl, { headers: { Accept: "text/html" }, credentials: "same-origin" });
    // The fragment is rendered by Django's templates, which escape and sanitize every value. Only the fragment:
    // never a page a redirect led to (the sign-in page).
    const type = response.headers.get("content-type") || "";
    if (response.ok && !response.redirected && type.startsWith("text/html")) panels.innerHTML = await response.text();
  }

  // A reply still cut off at the length limit after its continuations: say so, and offer to go on (a new
  // message asking for the rest; the model sees the cut reply in the conversation).
  const CONTINUE_MESSAGE = "Please continue where you stopped.";
  function cutNote(reply) {
    document.querySelectorAll("button.continue-reply").forEach(function (old) { old.remove(); });
    const note = document.createElement("p");
    note.className = "cut-note";
    note.textContent = "This reply was cut off at the length limit. ";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link continue-reply";
    button.textContent = "Continue";
    note.appendChild(button);
    reply.appendChild(note);
  }
  turns.addEventListener("click", function (e) {
    const target = e.target;
    if (!(target instanceof HTMLElement) || !target.classList.contains("continue-reply") || send.disabled) return;
    target.remove();
    input.value = CONTINUE_MESSAGE;
    form.requestSubmit();
  });

  const HANDED_OVER = "No automatic reply: this chat is with a person now, who will answer here.";

  // A reply as the server rendered it (markdown, sanitized with nh3), or as text when it could not.
  function show(element, data) {
    if (typeof data.html === "string") element.innerHTML = data.html;
    else element.textContent = data.reply || "";
  }

  function handle(event, data, reply) {
    const body = reply ? reply.querySelector(".bubble") : null;
    if (event === "turn") {
      // A turn run again after its worker died: what its first run streamed is not the reply; start afresh.
      if (data.resumed && body) { body.textContent = ""; reply.dataset.deltas = "0"; }
      reply.dataset.turn = data.turn_id;
      const mine = reply.previousElementSibling;
      if (mine && mine.classList.contains("user") && !mine.dataset.turn) mine.dataset.turn = data.turn_id;
      sending = null;
    } else if (event === "delta") {
      const dots = body.querySelector(".typing");
      if (dots) dots.remove();
      body.textContent += data.text;
      // How many pieces the reply arrived in (shown to nobody; lets tests and curious people check streaming).
      reply.dataset.deltas = String(Number(reply.dataset.deltas || 0) + 1);
      reveal(reply);
    } else if (event === "tool") {
      const note = document.createElement("span");
      note.className = "tool";
      note.textContent = "tool " + data.name + (data.ok ? " ✓" : " failed");
      reply.appendChild(note);
    } else if (event === "state") {
      const state = document.getElementById("workflow-state");
      if (state && data.state) {
        // The workflow's label for it, else in words ("GATHERING_ORIGIN" → "Gathering origin"); the name
        // stays in the title and data-state.
        const words = data.state.replace(/_/g, " ").trim().toLowerCase();
        state.textContent = data.label || words.charAt(0).toUpperCase() + words.slice(1);
        state.dataset.state = data.state;
        state.title = data.state;
      }
    } else if (event === "recovered") {
      // An earlier message whose answer was cut off (its server died) is answered first: fill its bubble.
      const earlier = document.querySelector('li.msg.assistant[data-turn="' + Number(data.turn_id) + '"] .bubble');
      if (earlier) { earlier.classList.remove("muted"); show(earlier, data); }
    } else if (event === "done") {
      // A turn still running, read where no run channel carries its events: its end comes as turn_done.
      if (data.turn_status === "running" || data.turn_status === "pending") return;
      reply.classList.remove("streaming");
      show(body, data);
      if (!data.reply && data.status === "needs_human") {
        body.classList.add("muted");
        body.textContent = HANDED_OVER;
      }
      if (data.turn_status === "failed") reply.classList.add("failed");
      if (withPerson) withPerson.hidden = data.status !== "needs_human";
      if (data.truncated) cutNote(reply);
      if (data.title) {
        const title = document.getElementById("chat-title");
        if (title && title.textContent !== data.title) {
          title.textContent = data.title;
          document.title = data.title + " · Agents";
        }
      }
      const mine = reply.previousElementSibling;
      if (data.message_cut && mine && mine.classList.contains("user") && !mine.querySelector(".cut-note")) {
        note(mine, "Too long for the model: it read the start and the end, " + data.message_cut.tokens_cut + " tokens in the middle were left out.");
      }
      if (data.is_demo) {
        const badge = document.createElement("span");
        badge.className = "badge demo small";
        badge.textContent = "demo model, not an LLM";
        reply.appendChild(badge);
      }
      reply.dataset.done = "1";
      reveal(reply);
    } else if (event === "error") {
      const dots = body.querySelector(".typing");
      if (dots) dots.remove();
      reply.classList.remove("streaming");
      reply.classList.add("failed");
      showError(data.message || "The reply failed.");
    }
  }

  function turnStatus(lines) {
    try { return JSON.parse(lines.join("\n")).turn_status || ""; } catch (_) { return ""; }
  }

  // Reads a reply's events; remembers the last event's id (a turn run by a turn worker has them) and whether
  // the stream reached its end, so that a dropped stream can be joined again where it left off.
  async function readStream(response, reply, seen) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const chunk = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let event = "message";
        let id = "";
        const lines = [];
        for (const line of chunk.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("id:")) id = line.slice(3).trim();
          else if (line.startsWith("data:")) lines.push(line.slice(5).trimStart());
        }
        if (id) seen.lastId = id;
        if (event === "error") seen.ended = true;
        if (event === "done" && !/^(?:running|pending)$/.test(turnStatus(lines))) seen.ended = true;
        if (lines.length) handle(event, JSON.parse(lines.join("\n")), reply);
      }
    }
  }

  // A stream dropped mid-reply (a network blip, a server restarted): the turn goes on where it runs, so join its
  // events again from the last one received, a few times, before telling the person to reload.
  async function rejoin(reply, seen) {
    for (let attempt = 1; attempt <= 6 && !seen.ended; attempt++) {
      await new Promise(function (resolve) { setTimeout(resolve, 500 * attempt); });
      try {
        const response = await fetch("/api/turns/" + Number(reply.dataset.turn) + "/events/", {
          credentials: "same-origin",
          headers: { Accept: "text/event-stream", "Last-Event-ID": seen.lastId },
        });
        if (response.ok) await readStream(response, reply, seen);
      } catch (_) { /* not back yet: try again */ }
    }
    return seen.ended;
  }

  // The message this tab is sending, until its turn's id is known: the events below must not draw it twice.
  let sending = null;

  form.addEventListener("submit", async function (e) {
    e.preventDefault();
    const message = input.value;
    if (!message.trim()) return;
    sending = message;
    errorBox.hidden = true;
    send.disabled = true;
    input.disabled = true;
    const mine = bubble("user", message);
    const reply = bubble("assistant", "");
    reply.classList.add("streaming");
    typing(reply);
    reveal(reply);
    try {
      const response = await fetch(form.dataset.streamUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "Content-Type": "application/json",
          Accept: "text/event-stream",
          "X-CSRFToken": csrf,
          "Idempotency-Key": newKey(),
        },
        body: JSON.stringify({ message: message }),
      });
      const type = response.headers.get("content-type") || "";
      if (response.ok && !type.startsWith("text/event-stream")) {
        // Not the reply stream: a redirect to the sign-in page, which fetch followed. Nothing was saved.
        mine.remove();
        reply.remove();
        showExpired();
        return;
      }
      if (response.status === 401) {
        let login = "";
        try { login = (await response.json()).error.details.login_url; } catch (_) { /* not JSON */ }
        mine.remove();
        reply.remove();
        showExpired(login);
        return;
      }
      if (response.status === 403 && !type.startsWith("application/json")) {
        // Django's CSRF refusal: signed out and in again elsewhere, the page's token is stale. Nothing was saved.
        mine.remove();
        reply.remove();
        showError("This page is out of date (you signed in or out in another tab). Your message is kept here: reload the page, then send it.");
        return;
      }
      if (!response.ok) {
        let text = "The message was not accepted (" + response.status + ").";
        try { text = (await response.json()).error.message || text; } catch (_) { /* not JSON */ }
        // Refused (4xx: busy, too long, too many): nothing was saved, so the transcript does not show it;
        // the text stays in the input to send again. A 5xx (a proxy's 502/504) may come after the save.
        if (response.status < 500) mine.remove();
        reply.remove();
        showError(text);
        return;
      }
      input.value = "";
      const seen = { lastId: "", ended: false };
      try {
        await readStream(response, reply, seen);
      } catch (err) {
        if (!seen.lastId || !reply.dataset.turn) throw err;
      }
      if (!seen.ended && seen.lastId && reply.dataset.turn && !(await rejoin(reply, seen))) {
        throw new Error("the reply stopped before its end");
      }
      await refreshPanels();
    } catch (err) {
      showError("The connection was lost: " + err.message + ". Reload the page to see the saved reply.");
    } finally {
      sending = null;
      send.disabled = false;
      input.disabled = false;
      input.focus();
    }
  });

  // A turn this page did not send (another tab, the API, MCP, a page loaded while it ran): its message, and its
  // reply followed live from the turn's events (/api/turns/<id>/events/, from the first); a turn that cannot be
  // followed is filled when it ends (turn_done).
  function drawTurn(data) {
    const id = Number(data.turn_id);
    let reply = turns.querySelector('li.msg.assistant[data-turn="' + id + '"]');
    if (reply) return reply;
    const mine = bubble("user", data.message || "");
    mine.dataset.turn = id;
    reply = bubble("assistant", "");
    reply.dataset.turn = id;
    return reply;
  }
  // A reply filled from a turn_done event (what is saved), not from the turn's own stream.
  function finish(li, data) {
    const bubbleEl = li.querySelector(".bubble");
    const dots = bubbleEl.querySelector(".typing");
    if (dots) dots.remove();
    li.classList.remove("streaming");
    if (data.reply) {
      bubbleEl.classList.remove("muted");
      show(bubbleEl, data);
    } else if (data.status === "completed") {
      bubbleEl.classList.add("muted");
      bubbleEl.textContent = HANDED_OVER;
    }
    if (data.status === "failed") li.classList.add("failed");
    li.dataset.done = "1";
    reveal(li);
    refreshPanels();
  }
  async function follow(reply) {
    if (reply.dataset.following === "1" || reply.dataset.done === "1") return;
    reply.dataset.following = "1";
    reply.classList.add("streaming");
    const body = reply.querySelector(".bubble");
    body.classList.remove("muted");
    body.textContent = "";
    typing(reply);
    const seen = { lastId: "", ended: false };
    reply.following = new AbortController();
    try {
      const response = await fetch("/api/turns/" + Number(reply.dataset.turn) + "/events/", {
        credentials: "same-origin",
        headers: { Accept: "text/event-stream" },
        signal: reply.following.signal,
      });
      if (response.ok) await readStream(response, reply, seen);
    } catch (_) { /* stopped by its turn_done, or failed: its turn_done fills it */ }
    reply.following = null;
    reply.dataset.following = "";
    if (seen.ended) await refreshPanels();
    else if (reply.dataset.done !== "1") reply.classList.remove("streaming");
  }
  turns.querySelectorAll('li.msg.assistant[data-running="1"]').forEach(function (li) { follow(li); });

  // What happens in this chat elsewhere, as it happens (server-sent events): a person's replies, the chat
  // handed to a person or back, a turn finished by another request. EventSource reconnects by itself, telling
  // the server (Last-Event-ID) what it has seen.
  const withPerson = document.getElementById("with-a-person");
  function staffBubble(data) {
    const key = data.turn_id + ":" + data.at;
    if (turns.querySelector('li.msg.staff[data-key="' + CSS.escape(key) + '"]')) return;
    const li = document.createElement("li");
    li.className = "msg staff";
    li.dataset.key = key;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = (data.author || "staff") + " · a person on our team";
    const div = document.createElement("div");
    div.className = "bubble";
    div.textContent = data.text || "";
    li.append(who, div);
    turns.appendChild(li);
    clampLong(li);
    reveal(li);
  }
  if (form.dataset.eventsUrl && window.EventSource) {
    const source = new EventSource(form.dataset.eventsUrl + "?since=" + encodeURIComponent(form.dataset.eventsSince));
    source.addEventListener("staff", function (e) { staffBubble(JSON.parse(e.data)); });
    source.addEventListener("status", function (e) {
      const data = JSON.parse(e.data);
      if (withPerson) withPerson.hidden = data.status !== "needs_human";
      handle("state", data, null);
    });
    source.addEventListener("turn_started", function (e) {
      const data = JSON.parse(e.data);
      if (turns.querySelector('li.msg.assistant[data-turn="' + Number(data.turn_id) + '"]')) return;
      if (sending !== null && sending === data.message) return; // this tab's own: its stream draws it
      follow(drawTurn(data));
    });
    source.addEventListener("turn_done", function (e) {
      const data = JSON.parse(e.data);
      let li = turns.querySelector('li.msg.assistant[data-turn="' + Number(data.turn_id) + '"]');
      if (!li) {
        if (sending !== null && sending === data.message) return;
        li = drawTurn(data);
      }
      if (li.dataset.done === "1") return;
      if (li.dataset.following === "1") {
        if (li.following) li.following.abort(); // what is saved is the whole reply
      } else if (li.classList.contains("streaming")) {
        return; // this tab's own, still streaming: its stream ends it
      }
      finish(li, data);
    });
    source.addEventListener("gone", function () { source.close(); });
    // The chat moved to another branch (an edit, a regenerate or a version chosen, in another tab): follow it.
    source.addEventListener("branch", function (e) {
      if (form.dataset.forking === "1") return; // this tab's own edit or regenerate: it moves there itself
      source.close();
      location.assign(JSON.parse(e.data).url);
    });
  }

  // An existing chat opens at its newest message, the earlier ones above it.
  reveal(turns.lastElementChild);

  // A server still loading its models answers, but slowly: say so until /readyz says it has them.
  const starting = document.getElementById("starting-up");
  async function watchStartup() {
    try {
      const response = await fetch(starting.dataset.readyUrl, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      const body = await response.json();
      if (body.status === "starting") {
        starting.hidden = false;
        setTimeout(watchStartup, 2000);
        return;
      }
    } catch (_) { /* the check itself failed: say nothing */ }
    starting.hidden = true;
  }
  if (starting) watchStartup();

  input.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); form.requestSubmit(); }
  });
})();

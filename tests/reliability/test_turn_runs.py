"""Turns run by a turn worker, as ``make run`` runs them: the web request saves the message and streams the turn's
events from the run channel; a Celery worker with a thread pool runs the turn under the session's lease.

Real processes: the ASGI web server (gunicorn with uvicorn workers, ``config.asgi``), a turn worker
(``celery worker -P threads``), Redis for the broker and the channel, the fake OpenAI server for the model.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from agents.models import Agent, LLMCall
from conftest import wait_for
from core.db import database_url
from orchestrator.runtime import stuck_turns_recover
from sessions.models import ChatSession, Turn
from sessions.services import session_create
from tests.fakes.openai_server import FakeOpenAIServer, hang, stream
from tests.reliability.conftest import (
    ROOT,
    ServerProcess,
    api_token,
    free_port,
    redis_queue_url,
    server_env,
    unique_queue,
)

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = "one two three four five six seven eight nine ten eleven twelve"


class TurnWorker:
    """``celery worker -Q <queue>-turns -P threads`` in its own process group; ``kill()`` is SIGKILL to it."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> TurnWorker:
        queue = self.env["CELERY_QUEUE"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO"),
                    *("-Q", f"{queue}-turns", "--pool", "threads", "--concurrency", "20"),
                    *("--hostname", f"turns-{queue}@%h", "--without-gossip", "--without-mingle"),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: " ready." in self.log.read_text(errors="replace"), timeout=60, message="the turn worker")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class Stack:
    def __init__(self, web: ServerProcess, worker: TurnWorker) -> None:
        self.web, self.worker = web, worker

    @property
    def url(self) -> str:
        return self.web.url


@pytest.fixture
def stack_env(tmp_path: Path, fake_openai: FakeOpenAIServer) -> dict[str, str]:
    redis_url = redis_queue_url()
    env = server_env(tmp_path, llm_profile=fake_openai.profile(read_timeout=30.0, max_retries=0))
    env.pop("CELERY_FILESYSTEM_BROKER_DIR", None)
    env.update(
        {
            "TURN_RUNNER": "worker",
            "CELERY_BROKER_URL": redis_url,
            "CELERY_QUEUE": unique_queue(),
            "RUN_EVENTS_URL": redis_url,
            "DATABASE_POOL_MAX_SIZE": "4",
            "TURN_LEASE_SECONDS": "5",
        }
    )
    return env


@pytest.fixture
def run_stack(tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Any]:
    """A factory: ``run_stack(worker=True, env={...})`` starts the ASGI web server and (unless ``worker=False``)
    a turn worker on the same broker, queue and channel."""
    started: list[Stack] = []

    def make(*, worker: bool = True, env: dict[str, str] | None = None) -> Stack:
        folder = tmp_path / f"stack-{len(started)}"
        folder.mkdir()
        full = {**stack_env, **(env or {})}
        web = ServerProcess(env=full, log_dir=folder, workers=1, asgi=True).start()
        turns = TurnWorker(full, folder / "worker.log")
        if worker:
            turns.start()
        stack = Stack(web, turns)
        started.append(stack)
        return stack

    yield make
    for stack in started:
        stack.worker.stop()
        stack.web.stop()


def _events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, event) of each SSE message."""
    event_id = ""
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            yield event_id, json.loads(line[6:])
            event_id = ""


def _headers(token: str, last_event_id: str = "") -> dict[str, str]:
    headers = {"Authorization": f"Token {token}", "Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return headers


def _follow(url: str, token: str, turn_id: int, last_event_id: str = "") -> list[tuple[str, dict[str, Any]]]:
    with httpx.stream(
        "GET", f"{url}/api/turns/{turn_id}/events/", headers=_headers(token, last_event_id), timeout=90
    ) as response:
        assert response.status_code == 200, response.read()
        return list(_events(response.iter_lines()))


def _text(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(event["text"] for _id, event in events if event["type"] == "delta")


def _chat(django_user_model: Any, chat_agent: Agent, name: str) -> tuple[str, ChatSession]:
    person = django_user_model.objects.create_user(username=name, password="runs-pass-123")
    return api_token(person), session_create(user=person, agent=chat_agent)


def test_a_dropped_stream_rejoined_with_last_event_id_gets_the_rest_once_and_the_model_is_asked_once(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, run_stack: Any
) -> None:
    fake_openai.enqueue(stream(WORDS, chunk_delay=0.3))
    stack = run_stack()
    token, session = _chat(django_user_model, chat_agent, "dropper")

    before: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream(
        "POST",
        f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
        json={"message": "Count to twelve, slowly."},
        headers=_headers(token),
        timeout=60,
    ) as response:
        assert response.status_code == 200
        for event_id, event in _events(response.iter_lines()):
            before.append((event_id, event))
            if sum(e["type"] == "delta" for _i, e in before) == 3:
                break  # the client drops here, mid-reply
    turn_id = before[0][1]["turn_id"]
    assert all(event_id for event_id, _e in before)  # every event of the run has an id

    rest = _follow(stack.url, token, turn_id, last_event_id=before[-1][0])

    assert rest[-1][1]["type"] == "done"
    assert _text(before) + _text(rest) == WORDS  # every delta once: none lost, none twice
    ids = [event_id for event_id, _e in before + rest]
    assert len(ids) == len(set(ids))
    assert len(fake_openai.chat_requests()) == 1
    turn = Turn.objects.get(pk=turn_id)
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, WORDS)
    assert list(LLMCall.objects.filter(turn=turn).values_list("purpose", flat=True)) == ["reply"]


def test_two_clients_of_one_turn_get_the_same_events(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, run_stack: Any
) -> None:
    fake_openai.enqueue(stream(WORDS, chunk_delay=0.2))
    stack = run_stack()
    token, session = _chat(django_user_model, chat_agent, "two-tabs")
    first: list[tuple[str, dict[str, Any]]] = []
    turn_started = threading.Event()

    def post() -> None:
        with httpx.stream(
            "POST",
            f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
            json={"message": "Count to twelve."},
            headers=_headers(token),
            timeout=60,
        ) as response:
            for item in _events(response.iter_lines()):
                first.append(item)
                turn_started.set()

    poster = threading.Thread(target=post)
    poster.start()
    assert turn_started.wait(30)
    second = _follow(stack.url, token, first[0][1]["turn_id"])  # a second tab, joining mid-reply
    poster.join(60)

    assert [e["type"] for _i, e in first][-1] == "done"
    assert first == second
    assert len(fake_openai.chat_requests()) == 1


def test_a_turn_worker_killed_mid_turn_leaves_its_turn_to_the_sweep_once_its_lease_runs_out(
    django_user_model: Any, chat_agent: Agent, remote_model: FakeOpenAIServer, run_stack: Any
) -> None:
    fake_openai = remote_model  # the sweep runs here, on the same model
    fake_openai.enqueue(hang(60, then=stream("too late")), stream("Answered after the crash."))
    stack = run_stack()
    token, session = _chat(django_user_model, chat_agent, "crashed")
    seen: list[tuple[str, dict[str, Any]]] = []

    def post() -> None:
        with httpx.stream(
            "POST",
            f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
            json={"message": "Are you there?"},
            headers=_headers(token),
            timeout=120,
        ) as response:
            seen.extend(_events(response.iter_lines()))

    client = threading.Thread(target=post)
    client.start()
    wait_for(lambda: len(fake_openai.chat_requests()) == 1, timeout=30, message="the worker's model call")
    stack.worker.kill()
    turn = Turn.objects.get(session=session)
    assert turn.status == Turn.Status.RUNNING

    # The dead worker's lease runs out (5 s here); only then may the sweep take the turn over.
    assert stuck_turns_recover(older_than=timedelta(0)) == 0
    wait_for(lambda: stuck_turns_recover(older_than=timedelta(0)) == 1, timeout=30, message="the sweep")
    client.join(60)  # the client, still waiting on the web server, is told how the turn ended

    turn.refresh_from_db()
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, "Answered after the crash.")
    assert seen[-1][1]["type"] == "done" and seen[-1][1]["reply"] == "Answered after the crash."
    assert LLMCall.objects.filter(turn=turn, outcome="ok").count() == 1
    assert stuck_turns_recover(older_than=timedelta(0)) == 0  # answered once: nothing left to resume


def test_the_web_server_killed_mid_turn_loses_nothing(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, run_stack: Any
) -> None:
    fake_openai.enqueue(stream(WORDS, chunk_delay=0.3))
    stack = run_stack()
    token, session = _chat(django_user_model, chat_agent, "web-crash")
    before: list[tuple[str, dict[str, Any]]] = []
    try:
        with httpx.stream(
            "POST",
            f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
            json={"message": "Count to twelve."},
            headers=_headers(token),
            timeout=60,
        ) as response:
            for item in _events(response.iter_lines()):
                before.append(item)
                if sum(e["type"] == "delta" for _i, e in before) == 2:
                    stack.web.kill()  # the machine serving the request goes down
    except httpx.TransportError:
        pass
    stack.web.start()

    rest = _follow(stack.url, token, before[0][1]["turn_id"], last_event_id=before[-1][0])

    assert rest[-1][1]["type"] == "done"
    assert _text(before) + _text(rest) == WORDS
    assert len(fake_openai.chat_requests()) == 1
    assert Turn.objects.get(session=session).assistant_message == WORDS


def _threads_of_web_workers(web: ServerProcess) -> int:
    assert web.proc is not None
    children = subprocess.run(["pgrep", "-P", str(web.proc.pid)], capture_output=True, text=True).stdout.split()
    return sum(len(os.listdir(f"/proc/{pid}/task")) for pid in children)


def test_300_open_event_streams_hold_no_threads(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, run_stack: Any
) -> None:
    release = threading.Event()
    fake_openai.enqueue(stream("All three hundred of you: hello.", hang=20))  # within the read timeout (30 s)
    stack = run_stack()
    token, session = _chat(django_user_model, chat_agent, "crowd")
    with httpx.stream(
        "POST",
        f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
        json={"message": "Hello, everyone."},
        headers=_headers(token),
        timeout=90,
    ) as response:
        turn_id = next(_events(response.iter_lines()))[1]["turn_id"]
        idle_threads = _threads_of_web_workers(stack.web)
        opened = threading.Semaphore(0)

        def follow(_: int) -> str:
            with httpx.stream(
                "GET", f"{stack.url}/api/turns/{turn_id}/events/", headers=_headers(token), timeout=90
            ) as events:
                opened.release()
                release.wait(60)
                return _text(list(_events(events.iter_lines())))

        with ThreadPoolExecutor(max_workers=300) as pool:
            followers = [pool.submit(follow, i) for i in range(300)]
            for _ in range(300):
                assert opened.acquire(timeout=60)
            crowded_threads = _threads_of_web_workers(stack.web)
            release.set()
            texts = [f.result(timeout=90) for f in followers]

    assert crowded_threads - idle_threads < 20, (idle_threads, crowded_threads)
    assert texts == ["All three hundred of you: hello."] * 300


def test_a_full_turns_queue_refuses_a_new_message_with_503_and_retry_after(
    django_user_model: Any, chat_agent: Agent, run_stack: Any
) -> None:
    stack = run_stack(worker=False, env={"TURN_QUEUE_LIMIT": "2"})  # no worker: turns wait in the queue
    chats = [_chat(django_user_model, chat_agent, f"queued-{i}") for i in range(3)]
    for token, session in chats[:2]:
        with httpx.stream(
            "POST",
            f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
            json={"message": "Hello?"},
            headers=_headers(token),
            timeout=30,
        ) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # accepted: its turn waits for a worker

    token, session = chats[2]
    refused = httpx.post(
        f"{stack.url}/api/sessions/{session.pk}/messages/",
        json={"message": "And me?"},
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    )

    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "busy"
    assert int(refused.headers["Retry-After"]) > 0
    assert not Turn.objects.filter(session=session).exists()  # nothing saved: send it again later


def test_mcp_answers_on_the_web_port(django_user_model: Any, run_stack: Any) -> None:
    stack = run_stack(worker=False)
    person = django_user_model.objects.create_user(username="mcp-person", password="mcp-pass-123")
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    anonymous = httpx.post(f"{stack.url}/mcp/", json=body, headers=headers, timeout=30)
    signed = httpx.post(
        f"{stack.url}/mcp/", json=body, headers={**headers, "Authorization": f"Bearer {api_token(person)}"}, timeout=30
    )

    assert anonymous.status_code == 401
    assert signed.status_code == 200, signed.text
    assert signed.json()["result"]["serverInfo"]["name"]
    assert httpx.get(f"{stack.url}/healthz", timeout=10).status_code in (200, 503)  # Django on the same port


@pytest.fixture
def pgbouncer() -> Iterator[str]:
    """Debian's PgBouncer in transaction mode in front of the test database; yields its DATABASE_URL."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        if os.environ.get("CI"):
            pytest.fail("needs pgbouncer: .ci/run installs Debian's package")
        pytest.skip("needs pgbouncer (apt-get install -y pgbouncer)")
    url = urlparse(database_url())
    query = parse_qs(url.query)
    host = (query.get("host") or [url.hostname or "127.0.0.1"])[0]
    port = url.port or 5432
    user = url.username or "postgres"
    # Outside pytest's (private) temporary folder: run as root, it drops to the database's own user, who must read
    # its configuration and write its log here.
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    folder.chmod(0o777)
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    listen = free_port()
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 6\nmax_client_conn = 500\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
    )
    for name in ("users.txt", "pgbouncer.ini"):
        (folder / name).chmod(0o644)
    as_user = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "nobody"
    argv = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        argv[1:1] = ["-u", as_user]  # it refuses to run as root
    out = (folder / "stderr.log").open("wb")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _answers(listen) or proc.poll() is not None, timeout=20, message="pgbouncer")
        assert proc.poll() is None, (folder / "stderr.log").read_text(errors="replace")
        yield f"postgresql://{user}@127.0.0.1:{listen}/{url.path.lstrip('/')}"
        logins = (folder / "pgbouncer.log").read_text(errors="replace").count("login attempt")
        assert logins > 0, "nothing connected through pgbouncer"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        out.close()
        shutil.rmtree(folder, ignore_errors=True)


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_turns_run_with_the_database_behind_pgbouncer_in_transaction_mode(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, run_stack: Any, pgbouncer: str
) -> None:
    """The lease needs no session state on a connection: the web server and the turn worker reach PostgreSQL only
    through PgBouncer, which hands each transaction any server connection."""
    people = 6
    fake_openai.enqueue(*(stream(f"Reply {i}.", chunk_delay=0.05) for i in range(2 * people)))
    stack = run_stack(
        env={"DATABASE_URL": pgbouncer, "DATABASE_TRANSACTION_POOLER": "true", "DATABASE_STATEMENT_TIMEOUT": "0"}
    )
    chats = [_chat(django_user_model, chat_agent, f"bounced-{i}") for i in range(people)]

    def two_messages(job: tuple[str, ChatSession]) -> list[str]:
        token, session = job
        ends = []
        for message in ("Hello!", "And again."):
            with httpx.stream(
                "POST",
                f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
                json={"message": message},
                headers=_headers(token),
                timeout=60,
            ) as response:
                assert response.status_code == 200, response.read()
                ends.append(list(_events(response.iter_lines()))[-1][1]["type"])
        return ends

    with ThreadPoolExecutor(max_workers=people) as pool:
        ends = list(pool.map(two_messages, chats))

    assert ends == [["done", "done"]] * people
    turns = Turn.objects.filter(session__in=[session for _token, session in chats])
    assert turns.count() == 2 * people
    assert set(turns.values_list("status", flat=True)) == {Turn.Status.COMPLETED}
    logs = stack.web.log_text() + stack.worker.log.read_text(errors="replace")
    assert "prepared statement" not in logs and "Traceback" not in logs


@pytest.mark.browser
def test_the_chat_page_joins_a_dropped_reply_again_where_it_left_off(
    django_user_model: Any,
    chat_agent: Agent,
    fake_openai: FakeOpenAIServer,
    run_stack: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a real browser: the web server dies mid-reply and comes back; the page joins the turn's events again
    from the last one it had (Last-Event-ID) and shows the whole reply, once, with no error."""
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{chromium} is missing: .ci/run installs Debian's chromium package")
        pytest.skip(f"{chromium} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's loop runs in this thread
    fake_openai.enqueue(stream(WORDS, chunk_delay=0.4))
    stack = run_stack()
    person = django_user_model.objects.create_user(username="pager", password="pager-pass-123")
    session = session_create(user=person, agent=chat_agent)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{stack.url}/accounts/login/?next=/chats/{session.pk}/")
            page.fill("input[name=username]", "pager")
            page.fill("input[name=password]", "pager-pass-123")
            page.click("button[type=submit]")
            page.wait_for_selector("#composer")
            page.fill("#message", "Count to twelve.")
            page.click("#send")
            page.wait_for_function(
                "() => Number((document.querySelector('li.msg.assistant') || {dataset: {}}).dataset.deltas || 0) >= 2",
                timeout=30_000,
            )
            stack.web.kill()  # mid-reply
            stack.web.start()
            page.wait_for_selector("li.msg.assistant[data-done='1']", timeout=60_000)
            reply = page.locator("li.msg.assistant[data-done='1'] .bubble").last.inner_text()
            error_hidden = page.locator("#chat-error").is_hidden() if page.locator("#chat-error").count() else True
        finally:
            browser.close()

    assert reply.strip() == WORDS
    assert error_hidden
    assert len(fake_openai.chat_requests()) == 1
    assert Turn.objects.get(session=session).assistant_message == WORDS


def test_open_chat_pages_wait_for_staff_replies_on_the_channel_holding_no_threads(
    django_user_model: Any, chat_agent: Agent, run_stack: Any, stack_env: dict[str, str]
) -> None:
    """A chat handed to a person keeps its page's events stream open for news. Under ASGI each one waited in a
    thread of its own, polling the database each second; now it waits for the session's change signal in the
    event loop, and a staff reply reaches every open page of the chat."""
    from django.test import Client, override_settings

    from orchestrator.runtime import handoff_reply, handoff_request

    stack = run_stack(worker=False)
    staff = django_user_model.objects.create_user(username="desk", password="runs-pass-123", is_staff=True)
    pages: list[tuple[ChatSession, dict[str, str]]] = []
    for number in range(25):
        person = django_user_model.objects.create_user(username=f"waiting-{number}", password="runs-pass-123")
        session = session_create(user=person, agent=chat_agent)
        Turn.objects.create(session=session, seq=1, user_message="A person, please.", status=Turn.Status.COMPLETED)
        assert handoff_request(session=session, actor=staff)
        browser = Client()
        browser.force_login(person)
        cookies = {"sessionid": browser.cookies["sessionid"].value}
        pages += [(session, cookies), (session, cookies)]  # two tabs each: the most one person may hold
    idle_threads = _threads_of_web_workers(stack.web)
    opened = threading.Semaphore(0)

    def page(session: ChatSession, cookies: dict[str, str]) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        with httpx.stream("GET", f"{stack.url}/chats/{session.pk}/events/", cookies=cookies, timeout=60) as response:
            assert response.status_code == 200, response.read()
            opened.release()
            for line in response.iter_lines():
                if line.startswith("data: "):
                    got.append(json.loads(line[6:]))
                    if got[-1].get("text"):
                        return got
        return got

    with ThreadPoolExecutor(max_workers=len(pages)) as pool:
        futures = [pool.submit(page, session, cookies) for session, cookies in pages]
        for _ in pages:
            assert opened.acquire(timeout=60)
        crowded_threads = _threads_of_web_workers(stack.web)
        with override_settings(RUN_EVENTS_URL=stack_env["RUN_EVENTS_URL"]):
            for session, _cookies in pages[::2]:
                handoff_reply(session=session, text=f"Hello from the desk, {session.user.username}.", author=staff)
        received = [future.result(timeout=60) for future in futures]

    assert crowded_threads - idle_threads < 20, (idle_threads, crowded_threads)
    for (session, _cookies), events in zip(pages, received, strict=True):
        assert events[-1].get("text") == f"Hello from the desk, {session.user.username}.", events


def test_a_turn_worker_killed_mid_reply_after_its_decision_resumes_the_turn_exactly_once(
    django_user_model: Any, remote_model: FakeOpenAIServer, run_stack: Any
) -> None:
    """Issue 54: a workflow turn decides inside its reply's call. Killed after the decision was applied and while
    the reply streamed, the turn is resumed by the sweep once: the decision is not taken (nor applied) again, the
    reply is asked for once more on its own, and the turn ends with that reply alone."""
    from tests.world import make_agent

    booker = make_agent("booking", slug="killed-booker")
    decided = json.dumps(
        {"next_state": "GATHERING_DESTINATION", "slots": {"origin": "Lisbon"}, "confidence": 0.9, "reply": WORDS}
    )
    remote_model.enqueue(stream(decided, chunk_delay=0.4), stream("Where are you flying to?"))
    stack = run_stack()
    token, session = _chat(django_user_model, booker, "decided-crash")
    seen: list[tuple[str, dict[str, Any]]] = []

    def post() -> None:
        with httpx.stream(
            "POST",
            f"{stack.url}/api/sessions/{session.pk}/messages/stream/",
            json={"message": "I fly from Lisbon"},
            headers=_headers(token),
            timeout=120,
        ) as response:
            seen.extend(_events(response.iter_lines()))

    client = threading.Thread(target=post)
    client.start()
    wait_for(lambda: "one two" in _text(seen), timeout=30, message="the reply streaming after its decision")
    stack.worker.kill()
    session.refresh_from_db()
    assert (session.state, session.data.get("origin")) == ("GATHERING_DESTINATION", "Lisbon")  # applied, once

    wait_for(lambda: stuck_turns_recover(older_than=timedelta(0)) == 1, timeout=30, message="the sweep")
    client.join(60)

    turn = Turn.objects.get(session=session)
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, "Where are you flying to?")
    assert seen[-1][1]["type"] == "done" and seen[-1][1]["reply"] == "Where are you flying to?"
    # What the killed run streamed is replaced by the reply as a whole at the end (a turn run again starts with a
    # "turn" event that says ``resumed``: the chat page starts its bubble afresh); nothing is shown twice.
    assert _text(seen).count("Where are you flying to?") <= 1
    assert session.checkpoints.filter(turn=turn, reason="transition").count() == 1  # decided once
    assert len(remote_model.chat_requests()) == 2
    assert "response_format" not in remote_model.chat_requests()[1].body  # the reply alone, not a new decision
    assert stuck_turns_recover(older_than=timedelta(0)) == 0


def test_the_openai_sdk_streams_and_answers_turns_run_by_the_turn_worker(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, run_stack: Any
) -> None:
    """``/v1/chat/completions`` as ``make run`` serves it: the turn on a turn worker, its events read from the run
    channel in the event loop (``RunStream``), written as OpenAI's chunks; then a whole answer for the next message."""
    import asyncio

    import openai

    fake_openai.enqueue(stream(WORDS, chunk_delay=0.05))
    fake_openai.enqueue(stream("Thirteen."))
    stack = run_stack()
    person = django_user_model.objects.create_user(username="sdk-person", password="sdk-pass-123")
    key = api_token(person)

    async def streamed() -> tuple[str, Any, list[str | None]]:
        client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=60)
        chunks = await client.chat.completions.create(
            model=chat_agent.slug,
            messages=[{"role": "user", "content": "Count to twelve."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, finishes = "", None, []
        async for chunk in chunks:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finishes.append(choice.finish_reason)
        await client.close()
        return text, usage, finishes

    text, usage, finishes = asyncio.run(streamed())
    assert text == WORDS and finishes[-1] == "stop"
    assert usage is not None and usage.completion_tokens > 0
    whole = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0).chat.completions.create(
        model=chat_agent.slug,
        messages=[
            {"role": "user", "content": "Count to twelve."},
            {"role": "assistant", "content": text},
            {"role": "user", "content": "And then?"},
        ],
    )
    assert whole.choices[0].message.content == "Thirteen."
    session = ChatSession.objects.get(user=person)  # one conversation, one session
    assert list(Turn.objects.filter(session=session).values_list("assistant_message", flat=True)) == [
        WORDS,
        "Thirteen.",
    ]
    assert len(fake_openai.chat_requests()) == 2

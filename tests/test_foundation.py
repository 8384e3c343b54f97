from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from conftest import ROOT, wait_for
from core.env import database_from_url, env_bool, env_choice, env_int, env_list, env_rate
from core.models import WorkerHeartbeat
from web.management.commands.runstack import ensure_first_staff_user


class TestEnvHelpers:
    def test_env_bool_parses_and_rejects(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("X_FLAG", "yes")
        assert env_bool("X_FLAG", False) is True
        monkeypatch.setenv("X_FLAG", "off")
        assert env_bool("X_FLAG", True) is False
        monkeypatch.setenv("X_FLAG", "maybe")
        with pytest.raises(ImproperlyConfigured, match="X_FLAG"):
            env_bool("X_FLAG", False)

    def test_env_int_bounds(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("X_NUM", "12")
        assert env_int("X_NUM", 1) == 12
        monkeypatch.setenv("X_NUM", "twelve")
        with pytest.raises(ImproperlyConfigured, match="not an integer"):
            env_int("X_NUM", 1)
        monkeypatch.setenv("X_NUM", "0")
        with pytest.raises(ImproperlyConfigured, match="below the minimum"):
            env_int("X_NUM", 1, minimum=1)

    def test_env_list(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("X_HOSTS", "a.example, b.example,,")
        assert env_list("X_HOSTS", []) == ["a.example", "b.example"]
        monkeypatch.delenv("X_HOSTS")
        assert env_list("X_HOSTS", ["d"]) == ["d"]

    def test_database_url(self) -> None:
        db = database_from_url("postgres://u:p%40ss@db.internal:6543/app?sslmode=require")
        assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
            "app",
            "u",
            "p@ss",
            "db.internal",
            "6543",
        )
        assert db["OPTIONS"] == {"sslmode": "require"}
        socket_db = database_from_url("postgresql://postgres:@/agents?host=/tmp/sock")
        assert socket_db["HOST"] == "/tmp/sock"
        with pytest.raises(ImproperlyConfigured, match="postgres"):
            database_from_url("sqlite:///db.sqlite3")
        with pytest.raises(ImproperlyConfigured, match="no database name"):
            database_from_url("postgres://u@h/")
        with pytest.raises(ImproperlyConfigured, match="DATABASE_URL has an invalid port"):
            database_from_url("postgres://u@h:54x2/app")

    def test_env_rate_is_what_drf_can_parse(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from rest_framework.throttling import SimpleRateThrottle

        for raw, expected in (("30/min", "30/min"), (" 5 / S ", "5/s"), ("1000/day", "1000/day")):
            monkeypatch.setenv("X_RATE", raw)
            assert env_rate("X_RATE", "1/s") == expected
            assert SimpleRateThrottle.parse_rate(SimpleRateThrottle.__new__(SimpleRateThrottle), expected)[0] >= 1
        for bad in ("sixty/min", "30", "30/fortnight", "0/min", "-1/s"):
            monkeypatch.setenv("X_RATE", bad)
            with pytest.raises(ImproperlyConfigured, match="X_RATE"):
                env_rate("X_RATE", "1/s")

    def test_env_choice(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("X_LEVEL", "warning")
        assert env_choice("X_LEVEL", "INFO", ("INFO", "WARNING")) == "WARNING"
        monkeypatch.setenv("X_LEVEL", "LOUD")
        with pytest.raises(ImproperlyConfigured, match="X_LEVEL='LOUD' is not one of INFO, WARNING"):
            env_choice("X_LEVEL", "INFO", ("INFO", "WARNING"))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("API_THROTTLE_USER", "sixty/min"),
        ("API_THROTTLE_MESSAGES", "30"),
        ("LOG_LEVEL", "LOUD"),
        ("WORKER_HEARTBEAT_SECONDS", "90"),
        ("DATABASE_URL", "postgres://u@db:port/app"),
    ],
)
def test_a_bad_setting_stops_the_start_naming_its_variable(name: str, value: str) -> None:
    """Checked where the settings are read, not on first use: a bad throttle rate made every API request a
    500; a heartbeat interval over 60 s made /healthz fail between heartbeats."""
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", name: value}
    env.setdefault("DATABASE_URL", "postgres://u@127.0.0.1:1/never-opened")
    if name != "DATABASE_URL":
        env["DATABASE_URL"] = "postgres://u@127.0.0.1:1/never-opened"
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and name in done.stderr, done.stderr[-2000:]


def _settings_in_a_new_process(tmp_path: Any, **env: str) -> subprocess.CompletedProcess[str]:
    """The settings as a process started with ``env`` over this one's (without DEBUG, SECRET_KEY and
    ALLOWED_HOSTS unless given) reads them: prints DEBUG, whether cookies are secure, and the key's length."""
    base = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS")}
    base.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": "postgres://u@127.0.0.1:1/never-opened",
            "APP_DATA_DIR": str(tmp_path),
        }
    )
    code = (
        "from django.conf import settings; "
        "print(settings.DEBUG, settings.SESSION_COOKIE_SECURE, len(settings.SECRET_KEY) > 40)"
    )
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_debug_is_off_unless_asked_for(tmp_path: Any) -> None:
    """`make run` serves the pages people use: an error there is the app's own page, not Django's debug page
    with code and requests. Locally the key is generated and kept, and cookies go over plain HTTP."""
    local = _settings_in_a_new_process(tmp_path)
    assert local.returncode == 0, local.stderr[-2000:]
    assert local.stdout.split() == ["False", "False", "True"]
    assert (tmp_path / "secret_key").exists()
    asked = _settings_in_a_new_process(tmp_path, DEBUG="true")
    assert asked.stdout.split()[0] == "True", asked.stderr[-2000:]
    # Serving others (ALLOWED_HOSTS set): the key must be given, and cookies are secure.
    deployed = _settings_in_a_new_process(tmp_path, ALLOWED_HOSTS="chat.example.com")
    assert deployed.returncode != 0 and "SECRET_KEY is required" in deployed.stderr, deployed.stderr[-2000:]
    keyed = _settings_in_a_new_process(tmp_path, ALLOWED_HOSTS="chat.example.com", SECRET_KEY="k" * 50)
    assert keyed.stdout.split() == ["False", "True", "True"], keyed.stderr[-2000:]


@pytest.mark.django_db
class TestPublicPages:
    def test_admin_login_page_loads(self, client: Client) -> None:
        response = client.get("/admin/login/")
        assert response.status_code == 200
        assert b"csrfmiddlewaretoken" in response.content

    def test_home_requires_login(self, client: Client) -> None:
        response = client.get("/")
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")

    def test_api_requires_auth(self, client: Client, alice: object) -> None:
        assert client.get("/api/me/").status_code == 401
        client.login(username="alice", password="alice-pass-123")
        assert client.get("/api/me/").json()["username"] == "alice"

    def test_openapi_schema_needs_a_login(self, client: Client, alice: object) -> None:
        assert client.get("/api/schema/", HTTP_ACCEPT="application/json").status_code == 401
        docs = client.get("/api/docs/")
        assert docs.status_code == 302 and docs["Location"].startswith("/accounts/login/?next=/api/docs/")
        client.login(username="alice", password="alice-pass-123")
        response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
        assert response.status_code == 200
        assert response.json()["openapi"].startswith("3.")

    def test_healthz_reports_pgvector_and_503_without_worker(self, client: Client) -> None:
        response = client.get("/healthz")
        body = response.json()
        assert body["database"]["ok"] is True
        assert tuple(int(n) for n in body["database"]["pgvector"].split(".")[:2]) >= (0, 8)  # iterative scans
        assert body["worker"]["ok"] is False  # no heartbeat in the test database
        assert response.status_code == 503


@pytest.mark.django_db
def test_first_staff_user_created_once(tmp_path: object, django_user_model: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    username, password = ensure_first_staff_user(folder)
    assert password and (folder / "first-staff-user.txt").read_text().count(password) == 1
    again, password_again = ensure_first_staff_user(folder)
    assert again == username and password_again is None
    assert django_user_model.objects.filter(is_staff=True).count() == 1  # type: ignore[attr-defined]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_task_runs_in_separate_worker_and_healthz_turns_green(celery_worker, client: Client) -> None:  # type: ignore[no-untyped-def]
    import os

    from web.tasks.core import record_worker_heartbeat

    record_worker_heartbeat.delay()
    beat = wait_for(
        lambda: WorkerHeartbeat.objects.filter(hostname__startswith=celery_worker.queue).first(),
        message="the worker's heartbeat row",
    )
    assert celery_worker.proc.pid != os.getpid()
    assert beat.hostname.startswith(celery_worker.queue)
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json()["broker"]["transport"] == celery_worker.transport


def test_a_test_without_the_worker_sends_its_tasks_to_no_one() -> None:
    """Once a test has started the session's Celery worker it stays up; a later test that did not ask for it
    must not feed it, or the worker would still be running that test's tasks while its database is flushed
    (the flush and the task deadlock). In a whole run the worker has started before this test runs."""
    from config.celery import app
    from conftest import _BROKERS, broker_for

    # The choice, whatever ran before: with the worker up, only a test that asks for it gets it.
    started = {"idle": {}, "worker": {}}
    assert broker_for(["db", "alice"], started=started) == "idle"
    assert broker_for(["db", "celery_worker"], started=started) == "worker"
    assert broker_for(["db", "celery_worker"], started={"idle": {}}) == "idle"  # not started yet
    # And what this test got.
    assert app.conf.task_default_queue == _BROKERS["idle"]["task_default_queue"]
    assert app.conf.broker_url == "filesystem://"


# Joined at run time: the debug page shows the source lines around the error, which must not hold them.
SECRETS = ("TopSecret" + "Pw", "Redis" + "Pw", "Webhook" + "Secret", "Api" + "TokenValue")


@pytest.fixture
def credentials_in_urls(settings: Any) -> None:
    database, redis, webhook, _token = SECRETS
    settings.DEBUG = True
    settings.DATABASE_URL = f"postgres://agents:{database}@db.internal:5432/agents"
    settings.REDIS_URL = f"redis://:{redis}@cache.internal:6379/0"
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    settings.ALERT_WEBHOOK_URL = f"https://hooks.slack.com/services/T000/B000/{webhook}"


@pytest.mark.usefixtures("credentials_in_urls")
def test_the_debug_page_hides_credentials_kept_in_urls() -> None:
    """With DEBUG on (working on the code), the error page must not print the database or broker password."""
    from django.test import RequestFactory
    from django.views.debug import technical_500_response

    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        request = RequestFactory().get("/", HTTP_AUTHORIZATION="Token " + SECRETS[3])
        page = technical_500_response(request, type(exc), exc, exc.__traceback__)

    html = page.content.decode()
    assert "RuntimeError" in html and "DATABASE_URL" in html and "REDIS_URL" in html
    assert not [secret for secret in SECRETS if secret in html]


def test_health_names_a_failure_without_its_details(monkeypatch: pytest.MonkeyPatch) -> None:
    """/healthz is open to anyone: the broker's address and credentials stay in the server log."""
    from config.celery import app
    from web.health import check_broker

    monkeypatch.setattr(app.conf, "broker_url", "redis://agent:BrokerPw@127.0.0.1:1/0")  # nothing listens

    result = check_broker()

    assert result["ok"] is False and result["error"].startswith("the broker is unreachable (")
    assert "BrokerPw" not in str(result) and "127.0.0.1" not in str(result)


def test_the_broker_check_keeps_its_connection_and_opens_a_new_one_for_another_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The health monitor checks the broker four times a second: a Redis-protocol broker is asked PING on one
    kept connection, not connected to afresh each time; another broker URL (or a failure) gets a new one."""
    from config.celery import app
    from core.db import redis_reachable
    from web import health

    if not redis_reachable():
        if os.environ.get("CI"):
            pytest.fail("needs Redis: .ci/run starts one when none answers at 127.0.0.1:6379")
        pytest.skip("needs a Redis-protocol broker at 127.0.0.1:6379")
    redis = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    monkeypatch.setattr(app.conf, "broker_url", redis)
    assert health.check_broker()["ok"] is True
    kept = health._broker_conn
    assert kept is not None and health.check_broker()["ok"] is True and health._broker_conn is kept

    monkeypatch.setattr(app.conf, "broker_url", "redis://127.0.0.1:1/0")  # nothing listens
    assert health.check_broker()["ok"] is False and health._broker_conn is None
    monkeypatch.setattr(app.conf, "broker_url", redis)
    assert health.check_broker()["ok"] is True and health._broker_conn is not kept


@pytest.mark.django_db
@pytest.mark.parametrize("login_url", ["/accounts/login/", "/admin/login/"])
def test_password_guessing_is_stopped(settings: Any, alice: Any, staff: Any, login_url: str) -> None:
    from django.core.cache import cache

    cache.clear()
    settings.LOGIN_MAX_FAILURES = 3
    user, password = (alice, "alice-pass-123") if login_url.startswith("/accounts") else (staff, "staff-pass-123")
    guesser, other_address = Client(REMOTE_ADDR="203.0.113.9"), Client(REMOTE_ADDR="198.51.100.7")

    for attempt in range(3):
        wrong = guesser.post(login_url, {"username": user.username, "password": f"guess-{attempt}"})
        assert wrong.status_code == 200 and "correct username and password" in wrong.content.decode()
    refused = guesser.post(login_url, {"username": user.username, "password": password})

    assert refused.status_code == 200 and "Too many failed sign-ins" in refused.content.decode()
    assert "_auth_user_id" not in guesser.session  # not signed in, though the password was right
    # The account is not locked for everyone: the right password from elsewhere signs in.
    assert other_address.post(login_url, {"username": user.username, "password": password}).status_code == 302
    cache.clear()


def test_behind_a_proxy_the_sign_in_count_is_per_client_and_a_forged_header_does_not_reset_it(
    settings: Any, alice: Any
) -> None:
    """With NUM_PROXIES = 1 (nginx in front) every request comes from the proxy's address; the client is the
    address nginx appended, the last of X-Forwarded-For. What the client wrote before it changes nothing."""
    settings.LOGIN_MAX_FAILURES = 2
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    proxy = "10.0.0.2"

    def attempt(forwarded: str, password: str) -> str:
        client = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR=forwarded)
        return client.post("/accounts/login/", {"username": alice.username, "password": password}).content.decode()

    for i in range(2):  # the guesser writes a new address of its own each time; nginx appends the real one
        assert "correct username and password" in attempt(f"192.0.2.{i}, 203.0.113.9", "wrong")
    assert "Too many failed sign-ins" in attempt("192.0.2.99, 203.0.113.9", "alice-pass-123")
    # Another client behind the same proxy is not locked out.
    assert "Too many failed sign-ins" not in attempt("198.51.100.7", "wrong")

    # Without NUM_PROXIES the header is ignored: the forged address cannot start a fresh count either.
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    direct = "203.0.113.50"
    for i in range(2):
        Client(REMOTE_ADDR=direct, HTTP_X_FORWARDED_FOR=f"192.0.2.{i}").post(
            "/accounts/login/", {"username": alice.username, "password": "wrong"}
        )
    forged = Client(REMOTE_ADDR=direct, HTTP_X_FORWARDED_FOR="192.0.2.200").post(
        "/accounts/login/", {"username": alice.username, "password": "alice-pass-123"}
    )
    assert "Too many failed sign-ins" in forged.content.decode()


def test_every_scheduled_task_exists_and_the_sweeps_are_scheduled(settings: Any) -> None:
    """Beat sends tasks by name: a name no worker knows would be dropped without a word."""
    from config.celery import app

    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled <= set(app.tasks), scheduled - set(app.tasks)
    assert {
        "web.tasks.agents.recover_stuck_turns",
        "web.tasks.memory.requeue_lost_memory_writes",
        "web.tasks.sessions.requeue_lost_summaries",
        "web.tasks.core.record_worker_heartbeat",
    } <= scheduled


@pytest.mark.django_db(transaction=True)
def test_the_tests_count_in_process_and_the_app_shares_its_counters_across_processes(tmp_path: Any) -> None:
    """Throttle and sign-in counters must be one per app, not one per gunicorn process: without Redis, and not
    on the embedded broker, the app's cache is a table in its database (made by a migration), so what one process
    counts another reads."""
    import subprocess
    import sys

    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache
    from django.db import connection

    from core.db import database_url

    assert isinstance(caches["default"], LocMemCache)  # the suite's counters never reach a running app's
    with connection.cursor() as cursor:  # made by the migration, though the suite's own cache is in memory
        cursor.execute("SELECT to_regclass('app_cache') IS NOT NULL")
        assert cursor.fetchone() == (True,)
    script = (
        "import django, sys; django.setup(); from django.core.cache import cache; "
        "cache.set('k', 41, 60) if sys.argv[1] == 'write' else print(cache.incr('k'))"
    )
    env = {
        **os.environ,
        "APP_DATA_DIR": str(tmp_path),
        "REDIS_URL": "",
        "CACHE_ON_EMBEDDED_BROKER": "false",
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    for step in ("write", "read"):
        done = subprocess.run(
            [sys.executable, "-c", script, step], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "42"


@pytest.mark.django_db(transaction=True)  # the checks read on threads of their own: the rows must be committed
def test_healthz_is_503_when_the_worker_heartbeat_is_stale(client: Client) -> None:
    from datetime import timedelta

    from django.utils import timezone

    beat = WorkerHeartbeat.objects.create(hostname="celery@gone", seen_at=timezone.now() - timedelta(seconds=120))
    # The session's test worker, once started, keeps beating: its row must not be the newest one read here.
    WorkerHeartbeat.objects.exclude(pk=beat.pk).delete()

    response = client.get("/healthz")

    body = response.json()
    assert response.status_code == 503 and body["database"]["ok"] is True
    assert body["worker"]["ok"] is False and body["worker"]["hostname"] == "celery@gone"
    # The age is read when the check runs, a moment after the row was written (121s on a loaded machine).
    age = re.search(r"last heartbeat (\d+)s ago \(more than 60s\)", body["worker"]["error"])
    assert age is not None and 120 <= int(age.group(1)) <= 130, body["worker"]["error"]
    WorkerHeartbeat.objects.filter(pk=beat.pk).update(seen_at=timezone.now())
    assert client.get("/healthz").json()["worker"]["ok"] is True


def test_every_environment_variable_the_code_reads_is_in_the_configuration_page() -> None:
    """docs/configuration.md's tables are the list of settings: a variable read by the code and missing
    there is a setting nobody can find. The README points there."""
    import re

    configuration = (ROOT / "docs" / "configuration.md").read_text()
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()
    read = set()
    for folder in ("config", "agents", "memory", "sessions", "observability"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            read |= set(re.findall(r"env_(?:int|str|bool|float|list)\(\s*\"([A-Z][A-Z0-9_]+)\"", text))
            read |= set(re.findall(r"os\.environ(?:\.get)?[\[(]\"([A-Z][A-Z0-9_]+)\"", text))
    assert len(read) > 40  # the patterns still find the settings
    missing = sorted(name for name in read if f"`{name}`" not in configuration)
    assert not missing, f"read by the code, not in docs/configuration.md: {missing}"

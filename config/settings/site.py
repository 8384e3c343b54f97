"""Where the app keeps its state, who it answers, its apps, middleware, pages, sign-in and request limits."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from core.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent.parent
# Local state (embedded PostgreSQL, the serverless broker, the generated secret key). Git-ignored.
DATA_DIR = Path(env_str("APP_DATA_DIR", str(BASE_DIR / ".data")) or BASE_DIR / ".data")

# Off unless asked for: Django's debug page shows code, settings and requests to whoever meets an error, and
# `make run` serves the pages people use. DEBUG=true for working on the code.
DEBUG = env_bool("DEBUG", False)
# ALLOWED_HOSTS set: the app answers under names of its own, for other people (a deployment, not `make run`).
SERVES_OTHERS = bool(env_str("ALLOWED_HOSTS"))


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if SERVES_OTHERS and not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY is required when ALLOWED_HOSTS is set (and DEBUG is off)")
    # Local use: generate once and keep it, so sessions survive restarts.
    path = DATA_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.write_text(key)
    path.chmod(0o600)
    return key


SECRET_KEY = _secret_key()
# The debug page and error reports also hide settings that hold credentials in URLs (core/reporting.py).
DEFAULT_EXCEPTION_REPORTER_FILTER = "core.reporting.SettingsFilter"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "core.apps.CoreConfig",
    "agents",
    "memory",
    "sessions.apps.ChatSessionsConfig",
    "observability",
    # The flight-booking demo: a workflow, two tools, the demo model's script for them, its Booking model, its
    # agent and its part of erasure, plugged in through AGENT_WORKFLOWS, AGENT_TOOLS, AGENT_SEEDS and
    # PERSON_ERASERS below as any package of yours would be (examples/booking/).
    "examples.booking",
    # Every door (admin, API, chat pages, ops pages, MCP, Celery tasks, management commands): last, so it sees
    # every model.
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # 413 for oversize bodies before anything reads them (JSON error format under /api/).
    "core.api_errors.RequestSizeLimitMiddleware",
    # 400 for a page address with a NUL (%00) in its query string (PostgreSQL refuses NUL in a filter).
    "core.api_errors.NulQueryMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, so its process_exception sees a view's database errors first: a 503 page, not a 500.
    "core.api_errors.DatabaseUnavailableMiddleware",
]

# Content-Security-Policy on every response (django-csp): scripts only from this site's files, never inline
# (no inline handler either); styles may be inline (the admin's and the charts' style attributes); nothing
# from another origin; no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

ROOT_URLCONF = "web.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]

LOGIN_URL = "/accounts/login/"
# Failed sign-ins for one username from one address before that pair is refused, and for how long.
LOGIN_MAX_FAILURES = env_int("LOGIN_MAX_FAILURES", 10, minimum=1)
LOGIN_FAILURE_WINDOW_SECONDS = env_int("LOGIN_FAILURE_WINDOW_SECONDS", 900, minimum=1)
# Reverse proxies of ours in front of the app (nginx, a load balancer), each appending to X-Forwarded-For.
# 0: the client is REMOTE_ADDR and the header is ignored (a client could write anything into it). n: the
# client is the n-th address from the header's end, the one our outermost proxy saw. Used by the sign-in
# throttle and, as DRF's NUM_PROXIES, by the API throttles. (/metrics never trusts forwarded headers.)
NUM_PROXIES = env_int("NUM_PROXIES", 0, minimum=0, maximum=10)
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
# Secure cookies where the app serves others (over HTTPS); `make run` answers on http://127.0.0.1.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", SERVES_OTHERS and not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", SERVES_OTHERS and not DEBUG)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# Request size limits: Django answers 400 past these; the API maps oversize bodies to 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 256 * 1024, minimum=1024)
# Largest import file through the API (POST /api/me/import/); bigger ones: manage.py import_person.
IMPORT_MAX_BYTES = env_int("IMPORT_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
# Paths whose bodies may be larger than MAX_REQUEST_BYTES, and their own limits.
# Largest request to the OpenAI-compatible door: chat UIs send the whole conversation with every message.
OPENAI_MAX_REQUEST_BYTES = env_int("OPENAI_MAX_REQUEST_BYTES", 4 * 1024 * 1024, minimum=1024)
LARGE_BODY_PATHS = {"/api/me/import/": IMPORT_MAX_BYTES, "/v1/chat/completions": OPENAI_MAX_REQUEST_BYTES}

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Static files are served by WhiteNoise straight from the app folders: no collectstatic step to forget.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(exist_ok=True)

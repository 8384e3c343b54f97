"""The REST API: authentication, throttles, the OpenAPI schema."""

from __future__ import annotations

from config.settings.site import NUM_PROXIES
from core.env import env_rate

# --- REST framework ----------------------------------------------------------------------
REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes an anonymous request a 401 rather than a 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "core.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_PARSER_CLASSES": ["core.parsers.SizeLimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "core.api_errors.api_exception_handler",
    "NUM_PROXIES": NUM_PROXIES,
    # Counted atomically (core/throttles.py: DRF's own let requests that arrive together all pass).
    # Every API endpoint needs a signed-in user (a 401 comes before any rate), so the rates are per user.
    "DEFAULT_THROTTLE_CLASSES": [
        "core.throttles.UserRateThrottleAtomic",
        "core.throttles.ScopedRateThrottleAtomic",
    ],
    # Posting a message runs the model, so it has its own, tighter scope.
    "DEFAULT_THROTTLE_RATES": {
        "user": env_rate("API_THROTTLE_USER", "1200/min"),
        "messages": env_rate("API_THROTTLE_MESSAGES", "30/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent runtime API",
    "DESCRIPTION": "Agents whose context, memory and state do not crash.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema is a page like any other: signed-in users only (the docs page redirects to the login).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Swagger UI and ReDoc assets come from the drf-spectacular-sidecar package: nothing loads from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "SessionStatusEnum": "sessions.models.ChatSession.Status",
        "TurnStatusEnum": "sessions.models.Turn.Status",
    },
    # drf-spectacular's enum hook, the error answers of every operation (core/api_schema.py), then the event
    # streams' events and the rules that span fields (web/api/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "core.api_schema.document_errors",
        "web.api.schema.describe_streams_and_requests",
    ],
}

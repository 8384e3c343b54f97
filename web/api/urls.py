"""Every /api/ route, gathered from the apps. The last route turns any other /api/ path into a JSON 404."""

from __future__ import annotations

from django.urls import path, re_path

from web.api.agents import AgentDetailApi, AgentListApi, DeleteMeApi, EraseMeApi, ExportMeApi, ImportMeApi
from web.api.core import api_not_found, metrics, whoami
from web.api.memory import MemoryDetailApi, MemoryListApi, MemorySearchApi
from web.api.sessions import (
    SessionBranchListApi,
    SessionCheckpointListApi,
    SessionDetailApi,
    SessionForkApi,
    SessionListApi,
    SessionMessageApi,
    SessionMessageStreamApi,
    SessionStateApi,
    TurnCompositionApi,
    TurnEventsApi,
)

urlpatterns = [
    path("me/", whoami, name="api-me"),
    path("me/erase/", EraseMeApi.as_view(), name="api-me-erase"),
    path("me/delete/", DeleteMeApi.as_view(), name="api-me-delete"),
    path("me/export/", ExportMeApi.as_view(), name="api-me-export"),
    path("me/import/", ImportMeApi.as_view(), name="api-me-import"),
    path("metrics/", metrics, name="api-metrics"),
    path("agents/", AgentListApi.as_view(), name="api-agents"),
    path("agents/<int:pk>/", AgentDetailApi.as_view(), name="api-agent"),
    path("sessions/", SessionListApi.as_view(), name="api-sessions"),
    path("sessions/<uuid:session_id>/", SessionDetailApi.as_view(), name="api-session"),
    path("sessions/<uuid:session_id>/fork/", SessionForkApi.as_view(), name="api-session-fork"),
    path("sessions/<uuid:session_id>/branches/", SessionBranchListApi.as_view(), name="api-session-branches"),
    path("sessions/<uuid:session_id>/state/", SessionStateApi.as_view(), name="api-session-state"),
    path("sessions/<uuid:session_id>/checkpoints/", SessionCheckpointListApi.as_view(), name="api-session-checkpoints"),
    path("sessions/<uuid:session_id>/messages/", SessionMessageApi.as_view(), name="api-session-messages"),
    path(
        "sessions/<uuid:session_id>/messages/stream/",
        SessionMessageStreamApi.as_view(),
        name="api-session-messages-stream",
    ),
    path("turns/<int:turn_id>/composition/", TurnCompositionApi.as_view(), name="api-turn-composition"),
    path("turns/<int:turn_id>/events/", TurnEventsApi.as_view(), name="api-turn-events"),
    path("memories/", MemoryListApi.as_view(), name="api-memories"),
    path("memories/search/", MemorySearchApi.as_view(), name="api-memory-search"),
    path("memories/<int:memory_id>/", MemoryDetailApi.as_view(), name="api-memory"),
    re_path(r"^(?P<unmatched>.*)$", api_not_found, name="api-not-found"),
]

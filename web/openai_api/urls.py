"""The OpenAI-compatible routes under /v1/ (docs/openai-compatible.md); any other /v1/ path is a 404 in OpenAI's
error shape."""

from __future__ import annotations

from django.urls import path, re_path

from web.openai_api.views import ChatCompletionsApi, ModelDetailApi, ModelListApi, openai_not_found

urlpatterns = [
    path("chat/completions", ChatCompletionsApi.as_view(), name="openai-chat-completions"),
    path("models", ModelListApi.as_view(), name="openai-models"),
    path("models/<str:model>", ModelDetailApi.as_view(), name="openai-model"),
    re_path(r"^(?P<unmatched>.*)$", openai_not_found, name="openai-not-found"),
]

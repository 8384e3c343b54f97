"""Every /api/ route, gathered from the apps."""

from __future__ import annotations

from django.urls import path

from config.api import whoami

urlpatterns = [
    path("me/", whoami, name="api-me"),
]

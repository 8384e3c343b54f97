from __future__ import annotations

from django.urls import path

from web.ops import views

app_name = "observability"

urlpatterns = [
    path("ops/", views.dashboard, name="dashboard"),
    path("ops/sessions/<uuid:session_id>/", views.session_health, name="session-health"),
    path("metrics", views.metrics, name="metrics"),
]

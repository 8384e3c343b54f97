from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from core.auth import AdminLoginForm, LoginForm
from web.health import healthz, readyz

admin.site.login_form = AdminLoginForm  # the same limit on guessing passwords as the chat's login page

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(authentication_form=LoginForm), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its start-up script as a file of its own: no inline script (the CSP forbids it).
    path("api/docs/", login_required(SpectacularSwaggerSplitView.as_view(url_name="api-schema")), name="api-docs"),
    path("api/", include("web.api.urls")),
    # The OpenAI-compatible door: any OpenAI SDK or chat UI talks to an agent (docs/openai-compatible.md).
    path("v1/", include("web.openai_api.urls")),
    path("", include("web.ops.urls")),
    path("", include("web.chat.urls")),
]

"""The person's own account page: what is kept about them (an export), and deleting the account."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from people.erasure import ACCOUNT_DELETE_CONFIRMATION, account_delete
from sessions.locks import SessionBusyError

DELETE_CONFIRMATION = ACCOUNT_DELETE_CONFIRMATION


@login_required
@require_http_methods(["GET", "POST"])
def account(request: HttpRequest) -> HttpResponse:
    """GET: the page. POST with ``confirm`` exactly "delete my account": everything kept about the person is
    erased, then the account; they are signed out."""
    if request.method == "POST":
        if request.POST.get("confirm", "") != DELETE_CONFIRMATION:
            messages.error(request, f'Type "{DELETE_CONFIRMATION}" to delete your account. Nothing was deleted.')
            return redirect("account")
        try:
            account_delete(user=request.user)
        except SessionBusyError as exc:
            messages.error(request, str(exc))
            return redirect("account")
        logout(request)
        messages.success(request, "Your account and everything kept about you were deleted.")
        return redirect("login")
    return render(request, "account.html", {"confirmation": DELETE_CONFIRMATION})

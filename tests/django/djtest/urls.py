"""A login page (Django's own, with its CSRF token) and a view that publishes on commit."""

from __future__ import annotations

from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from shmbus.adapters.integrations.django import publish_on_commit


def login_page(request: HttpRequest) -> HttpResponse:
    """Django's LoginView needs a template; the tests only need its form handling and CSRF."""
    view = LoginView.as_view(template_name="unused.html", next_page="/whoami")
    if request.method == "GET":
        from django.middleware.csrf import get_token

        return HttpResponse(get_token(request))
    return view(request)  # type: ignore[no-any-return]


def whoami(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"user": request.user.pk if request.user.is_authenticated else None})


def note(request: HttpRequest) -> JsonResponse:
    """POST text: published to the poster only, when the (autocommit) request's work commits."""
    if not request.user.is_authenticated:
        return JsonResponse({"error": "log in"}, status=403)
    publish_on_commit("/notes", {"text": request.POST.get("text", "")}, user_ids=[request.user.pk])
    return JsonResponse({"ok": True})


urlpatterns = [path("login/", login_page), path("whoami", whoami), path("note", note)]

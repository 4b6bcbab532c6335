"""The chat: a join form (a name is enough: an example, not an auth system), the room, and a post view that
publishes the saved message with ``publish_on_commit`` (``ATOMIC_REQUESTS``: it goes out when the view's
transaction commits, so every browser that hears of it can already read it)."""

from __future__ import annotations

import os

from django.contrib.auth import login
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from shmbus.adapters.integrations.django import get_bus, publish_on_commit

from .models import Message


def room(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return render(request, "chat/join.html", {"next": request.get_full_path()})
    last_id = get_bus().last_id("/chat")  # first the bus's position, then the rows: the page drops duplicates
    recent = list(Message.objects.select_related("author").order_by("-pk")[:30])[::-1]
    return render(request, "chat/room.html", {"messages": [m.as_json() for m in recent], "last_id": last_id})


@require_POST
def join(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "").strip()[:30]
    if not name:
        return render(request, "chat/join.html", {"next": "/", "error": "a name, please"}, status=400)
    user, _ = User.objects.get_or_create(username=name)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    target = request.POST.get("next", "/")
    return redirect(target if url_has_allowed_host_and_scheme(target, allowed_hosts=None) else "/")


@require_POST
def post(request: HttpRequest) -> JsonResponse:
    if not request.user.is_authenticated:
        return JsonResponse({"error": "join first"}, status=403)
    text = request.POST.get("text", "").strip()
    if not text or len(text) > 500:
        return JsonResponse({"error": "1 to 500 characters"}, status=400)
    msg = Message.objects.create(author=request.user, text=text)
    publish_on_commit("/chat", {**msg.as_json(), "pid": os.getpid()})
    return JsonResponse({"id": msg.pk, "pid": os.getpid()})

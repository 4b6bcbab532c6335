from __future__ import annotations

from django.conf import settings
from django.db import models


class Message(models.Model):
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.CharField(max_length=500)
    created = models.DateTimeField(auto_now_add=True)

    def as_json(self) -> dict[str, object]:
        return {"id": self.pk, "user": self.author.get_username(), "text": self.text}

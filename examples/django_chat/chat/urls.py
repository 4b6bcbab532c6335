from django.urls import path

from . import views

urlpatterns = [
    path("", views.room),
    path("join", views.join),
    path("post", views.post),
]

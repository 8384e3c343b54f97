from __future__ import annotations

from django.urls import path

from web.chat import account, branches, events, views

urlpatterns = [
    path("", views.home, name="home"),
    path("account/", account.account, name="account"),
    path("chats/new/", views.chat_new, name="chat-new"),
    path("chats/<uuid:session_id>/", views.chat, name="chat"),
    path("chats/<uuid:session_id>/panels/", views.chat_panels, name="chat-panels"),
    path("chats/<uuid:session_id>/stream/", views.chat_stream, name="chat-stream"),
    path("chats/<uuid:session_id>/events/", events.chat_events, name="chat-events"),
    path("chats/<uuid:session_id>/delete/", views.chat_delete, name="chat-delete"),
    path("chats/<uuid:session_id>/fork/", branches.chat_fork, name="chat-fork"),
    path("chats/<uuid:session_id>/switch/", branches.chat_switch, name="chat-switch"),
]

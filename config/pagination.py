"""The API's pagination (kept apart from the views: DRF imports it while loading its settings)."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination


class StandardPagination(PageNumberPagination):
    """``?page=N&page_size=M`` (at most 200); the body has count, next, previous and results."""

    page_size_query_param = "page_size"
    max_page_size = 200

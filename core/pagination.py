"""The API's pagination (kept apart from the views: DRF imports it while loading its settings)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class StandardPagination(PageNumberPagination):
    """``?page=N&page_size=M`` (at most 200); the body has count, next, previous and results."""

    page_size_query_param = "page_size"
    max_page_size = 200

    def get_page_size(self, request: Request) -> int | None:
        """``page_size`` as the schema says: a whole number, 1 or more (more than 200 gives 200). DRF's own
        answered ``page_size=null`` (or ``abc``, ``0``, ``-1``) with the default page, as if it were not sent."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        # Digits only, and not thousands of them (int() refuses past 4,300 digits).
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or int(raw) < 1:
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number, 1 or more (at most {self.max_page_size} are given)."]}
            )
        return min(int(raw), self.max_page_size)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {**parameter["schema"], "minimum": 1}
                parameter["description"] = f"Results per page: 1 or more; at most {self.max_page_size} are given."
        return parameters

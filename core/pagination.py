"""The API's pagination (kept apart from the views: DRF imports it while loading its settings)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

# Past any page or page size there can be: longer numbers are not read (int() refuses past 4,300 digits).
_MOST_DIGITS = 18


def _whole_number(raw: str) -> int | None:
    """``raw`` as a whole number, 1 or more (one past any there can be when it is longer); None when it is not."""
    if not (raw.isascii() and raw.isdigit()) or not raw.strip("0"):
        return None
    digits = raw.lstrip("0")
    return 10**_MOST_DIGITS if len(digits) > _MOST_DIGITS else int(digits)


class StandardPagination(PageNumberPagination):
    """``?page=N&page_size=M`` (more than 200 give 200); the body has count, next, previous and results.

    Both are whole numbers, 1 or more, as the schema says: anything else (``page=``, ``page=last``, ``page=0``,
    ``page_size=null``) is a 400 naming the parameter. DRF's own read an empty or unreadable page size as the
    default and an unreadable page as a 404."""

    page_size_query_param = "page_size"
    max_page_size = 200

    def get_page_size(self, request: Request) -> int | None:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        size = _whole_number(raw)
        if size is None:
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number, 1 or more (at most {self.max_page_size} are given)."]}
            )
        return min(size, self.max_page_size)

    def get_page_number(self, request: Request, paginator: Any) -> int:
        raw = request.query_params.get(self.page_query_param)
        if raw is None:
            return 1
        number = _whole_number(raw)
        if number is None:
            raise ValidationError({self.page_query_param: ["A page number: a whole number, 1 or more."]})
        return number  # past the last page: DRF's 404

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_query_param:
                parameter["schema"] = {**parameter["schema"], "minimum": 1}
                parameter["description"] = "A page number, 1 or more; one past the last page is a 404."
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {**parameter["schema"], "minimum": 1}
                parameter["description"] = f"Results per page: 1 or more; at most {self.max_page_size} are given."
        return parameters

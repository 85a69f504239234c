"""Paging and sorting of the console's tables: a page of rows and where it sits in the whole,
the columns each paged table sorts by (`SORTS`, one list for the queries and the pages), and
the ORDER BY that sorts the whole result in the database before it is paged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnExpressionArgument

from .errors import InvalidInput

PAGE_SIZE = 50


@dataclass(frozen=True)
class Sort:
    """How a paged table is ordered: one of its `SORTS` keys, and the direction."""

    key: str
    descending: bool


@dataclass(frozen=True)
class Page:
    """One page of rows, where it sits in the whole, and the order of the whole."""

    rows: list[Any]
    page: int
    total: int
    size: int = PAGE_SIZE
    sort: Sort | None = None

    @property
    def pages(self) -> int:
        """How many pages there are (at least 1)."""
        return max(1, -(-self.total // self.size))

    @property
    def sort_params(self) -> dict[str, str]:
        """The query parameters that keep this order (for the pager's links)."""
        if self.sort is None:
            return {}
        return {"sort": self.sort.key, "dir": "desc" if self.sort.descending else "asc"}


# The columns each paged table sorts by, and its default order (the first key given).
SORTS: dict[str, tuple[str, ...]] = {
    "tenants": ("name", "status", "keys", "adapters", "rpm", "tpm", "quota", "created"),
    "adapters": ("created", "tenant", "adapter", "version", "base", "status", "rank", "size"),
    "jobs": ("created", "kind", "tenant", "state", "attempts", "finished"),
    "audit": ("when", "actor", "operator", "action", "resource", "tenant"),
}
_DEFAULT_DESCENDING = {"tenants": False, "adapters": True, "jobs": True, "audit": True}


def parse_sort(table: str, key: str = "", direction: str = "") -> Sort:
    """The order a page asked for (`sort`, `dir` query values); the table's default when
    empty. Raises InvalidInput (400) naming an unknown key or direction."""
    keys = SORTS[table]
    if key and key not in keys:
        raise InvalidInput(
            f"cannot sort by {key[:64]!r}: sort by one of {', '.join(keys)}", param="sort"
        )
    if direction not in ("", "asc", "desc"):
        raise InvalidInput(
            f"dir {direction[:16]!r} is not asc or desc", param="dir", code="invalid_sort"
        )
    if not key:
        return Sort(keys[0], _DEFAULT_DESCENDING[table] if not direction else direction == "desc")
    return Sort(key, direction == "desc")


def ordered(
    sort: Sort, columns: dict[str, Any], tiebreak: ColumnExpressionArgument[Any]
) -> list[Any]:
    """ORDER BY terms for `sort` over `columns` (a nullable column's empty values last either
    way; NOT NULL columns keep plain order, which their indexes serve), then a unique column
    so pages never overlap."""
    col = columns[sort.key]
    term = col.desc() if sort.descending else col.asc()
    nullable = getattr(getattr(col, "expression", col), "nullable", False)
    return [term.nulls_last() if nullable else term, tiebreak]


def page_number(page: int) -> int:
    """A page number within 1..100,000."""
    return max(1, min(int(page), 100_000))

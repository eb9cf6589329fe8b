"""A variant's figures over a reference variant's, as every benchmark reports them (torch-free: the GPU check's
summary uses them from its EXIT trap). Rows are a benchmark's records: dataclasses or dicts with a `status`."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

Row = TypeVar("Row")


def value(row: Any, name: str) -> Any:
    """A row's field, whether the row is a dict (a benchmark's JSON) or a dataclass."""
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def ok_row(rows: Iterable[Row], **key: Any) -> Optional[Row]:
    """The first row that measured (`status` ok) and whose fields equal `key`'s; None when none did."""
    for row in rows:
        if value(row, "status") == "ok" and all(value(row, k) == v for k, v in key.items()):
            return row
    return None


def ratio(figure: Optional[float], reference: Optional[float], digits: Optional[int] = None) -> Optional[float]:
    """figure / reference (rounded to `digits` where given); None when either was not measured or the reference
    is zero."""
    if figure is None or not reference:
        return None
    return figure / reference if digits is None else round(figure / reference, digits)

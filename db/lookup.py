"""Fetch one row by its id or raise NotFound naming the request field: the store's one way to say "no such X"."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.errors import NotFound

Row = TypeVar("Row")


def row_by_id(session: Session, model: type[Row], row_id: str, field: str, what: str) -> Row:
    """`model`'s row whose `id` (the public id, not the integer key) is `row_id`, or NotFound(field)."""
    row = session.scalar(select(model).where(model.id == row_id))
    if row is None:
        raise NotFound(field, f"no {what} {row_id!r}")
    return row

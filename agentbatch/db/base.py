"""The declarative base every table of the store shares (one metadata for Alembic and tests)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON
from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


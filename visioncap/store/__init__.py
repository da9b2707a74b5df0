"""Caption storage: SQLAlchemy 2 over SQLite (default) or PostgreSQL."""

from visioncap.store.captions import CaptionStore, NewCaption, PendingRow
from visioncap.store.database import create_db_engine
from visioncap.store.records import CaptionRecord, CaptionStatus

__all__ = ["CaptionRecord", "CaptionStatus", "CaptionStore", "NewCaption", "PendingRow", "create_db_engine"]

"""Caption storage: SQLAlchemy 2 over SQLite (default) or PostgreSQL."""

from visioncap.store.captions import CaptionStore, NewCaption
from visioncap.store.database import create_db_engine
from visioncap.store.records import CaptionRecord

__all__ = ["CaptionRecord", "CaptionStore", "NewCaption", "create_db_engine"]

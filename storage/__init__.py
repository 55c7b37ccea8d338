"""Persistence for dimr studies: Optuna's RDB storage plus dimr's own mask ledger, on one SQL database.

The search driver only talks to `open_storage` and `MaskLedger`; it never imports SQLAlchemy.
"""

from storage.ledger import Claim, MaskLedger
from storage.rdb import DEFAULT_URL, StorageError, open_storage, validate_url

__all__ = ["Claim", "DEFAULT_URL", "MaskLedger", "StorageError", "open_storage", "validate_url"]

"""Where the key store lives and where its key-encryption key comes from.

Read from the environment (``HALLMARK_DATABASE_URL``, ``HALLMARK_KEK``,
``HALLMARK_KEK_FILE``) or built explicitly; :func:`keys.kek.load_keyring` turns the KEK
fields into a keyring and refuses a missing or malformed KEK.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./var/hallmark.db"
# The development KEK that `hallmark quickstart` (`make run`) creates beside the default
# database; with that database and no KEK configured, the CLI and the server both use it.
DEV_KEK_FILE = Path("var/kek.key")


class StoreSettings(BaseSettings):
    """Database URL and KEK source of the key store."""

    # Other components read their own HALLMARK_* variables from the same environment.
    model_config = SettingsConfigDict(env_prefix="HALLMARK_", extra="ignore", frozen=True,
                                      env_ignore_empty=True)

    database_url: str = DEFAULT_DATABASE_URL
    """SQLAlchemy URL: ``sqlite:///path.db`` (embedded) or
    ``postgresql+psycopg://user@host:5432/db`` (production)."""

    kek: SecretStr | None = Field(default=None, repr=False, exclude=True)
    """The key-encryption key itself: base64 of exactly 32 random bytes."""

    kek_file: Path | None = None
    """A file (mode 0600) holding the base64 KEK; use instead of ``kek``, not with it."""

    kek_previous: SecretStr | None = Field(default=None, repr=False, exclude=True)
    """Staged KEK rollout: the previous KEK, used only to unwrap (never to wrap)."""

    kek_previous_file: Path | None = None
    """A file holding the previous KEK; use instead of ``kek_previous``."""

    token_ttl_days: float = Field(default=90.0, ge=0)
    """How long an API token works by default (``hallmark tokens issue``, which ``--ttl``
    overrides); 0: tokens never expire unless given a ``--ttl``."""

    busy_timeout_ms: int = Field(default=5000, ge=0)
    """SQLite: how long a writer waits for another writer before giving up."""

"""The key store's exceptions.

Every exception carries ``user_message``: one line saying what is wrong and what to do.
The CLI prints it as ``error: <user_message>``; the HTTP layer may map the classes to
status codes. A message never holds a secret, a KEK or a raw token: callers build them
only from identifiers (names, key ids, fingerprints, KEK ids) and counts.
"""

from __future__ import annotations


class KeyStoreError(Exception):
    """Base class: a failure a caller or operator can act on."""

    def __init__(self, user_message: str) -> None:
        super().__init__(user_message)
        self.user_message = user_message


# --- configuration and the KEK ---------------------------------------------------------


class ConfigError(KeyStoreError):
    """A setting is missing or malformed."""


class KekError(KeyStoreError):
    """The key-encryption key is missing, malformed, or not the one the store uses."""


class UnwrapError(KeyStoreError):
    """A wrapped secret did not authenticate. Deliberately says nothing about why."""

    def __init__(self, key_id: str) -> None:
        super().__init__(
            f"watermark key {key_id} could not be decrypted: its stored ciphertext does not "
            "authenticate (altered, or moved from another row); restore the row from a backup"
        )
        self.key_id = key_id


# --- the database ----------------------------------------------------------------------


class StoreUnavailable(KeyStoreError):
    """The database cannot be reached or opened."""


class NotMigrated(KeyStoreError):
    """The database schema is missing or at another revision than this code expects."""


class ReadOnlyStore(KeyStoreError):
    """The database (file) cannot be written."""


class StoreBusy(KeyStoreError):
    """Another writer held the database for longer than the busy timeout."""


class ConcurrentChange(KeyStoreError):
    """A concurrent transaction changed the same rows; the caller may retry."""


# --- domain ----------------------------------------------------------------------------


class InvalidInput(KeyStoreError, ValueError):
    """An argument is malformed (a name, a reason, a count, a spec)."""


class UnknownTenant(KeyStoreError, LookupError):
    def __init__(self, name: str, *, is_id: bool = False) -> None:
        if is_id:
            message = f"unknown tenant id {name!r}; see `hallmark tenants list`"
        else:
            message = (f"unknown tenant {name!r}; see `hallmark tenants list` or create it with "
                       f"`hallmark tenants create {name}`")
        super().__init__(message)
        self.name = name


class DuplicateTenant(KeyStoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} already exists; choose another name")
        self.name = name


class UnknownKey(KeyStoreError, LookupError):
    def __init__(self, key_id: str) -> None:
        super().__init__(f"unknown key {key_id!r}; see `hallmark keys list`")
        self.key_id = key_id


class NoActiveKey(KeyStoreError, LookupError):
    def __init__(self, tenant: str) -> None:
        super().__init__(
            f"tenant {tenant!r} has no active key; create one with "
            f"`hallmark keys create --tenant {tenant}`"
        )
        self.tenant = tenant


class DuplicateKey(KeyStoreError):
    """An imported secret is already stored (same fingerprint)."""

    def __init__(self, fingerprint: str, key_id: str, tenant: str) -> None:
        super().__init__(
            f"a key with fingerprint {fingerprint} is already stored as {key_id} of tenant "
            f"{tenant!r}; one secret cannot belong to two keys"
        )


class InvalidTransition(KeyStoreError):
    """A lifecycle change that the key's current state does not allow."""


class UnknownToken(KeyStoreError, LookupError):
    def __init__(self, token_id: str) -> None:
        super().__init__(f"unknown token {token_id!r}; see `hallmark tokens list`")
        self.token_id = token_id


class AuditLogImmutable(KeyStoreError):
    def __init__(self) -> None:
        super().__init__("the audit log is append-only: events cannot be changed or deleted")


class LedgerImmutable(KeyStoreError):
    def __init__(self) -> None:
        super().__init__("the provenance ledger is append-only: entries cannot be changed or deleted")


class StaleKek(KekError):
    """This process's KEK is not the store's current KEK (a rotation happened)."""


class KeyRevoked(KeyStoreError):
    """The key a generation ran under was revoked before its record was written."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"key {key_id} was revoked while the generation ran; its output is not recorded "
                         "as watermarked by an active key")
        self.key_id = key_id

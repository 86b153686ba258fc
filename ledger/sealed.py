"""What the ledger keeps sealed under the store's KEK: its signing keys and its log key.

``hallmark kek rotate`` and ``kek status`` pass these to the key store
(:func:`keys.kek_rotation.rotate_kek`, :func:`~keys.kek_rotation.kek_status`), which re-wraps
and counts them without importing the ledger. A rotation must be given all of them: a
secret left under the old KEK opens nothing once that KEK is dropped.
"""

from __future__ import annotations

from keys.kek_rotation import KekDependant
from ledger.log.key import SealedLogKey
from ledger.signing import SealedSigningKeys

KEK_DEPENDANTS: tuple[KekDependant, ...] = (SealedSigningKeys(), SealedLogKey())
"""In the order the rotation re-wraps them and its audit event counts them."""

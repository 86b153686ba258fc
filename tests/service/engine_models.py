"""The checkpoints engine tests run (light: no server imports, so GPU machines without the
service's web stack can import it)."""

from __future__ import annotations

import os

# Tests may point at another checkpoint pair (e.g. while the bundled models are rebuilt).
TEST_MODEL = os.environ.get("HALLMARK_TEST_MODEL", "bundled")
TEST_DRAFT = os.environ.get("HALLMARK_TEST_DRAFT", "hallmark-tiny-draft")

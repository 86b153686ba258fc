"""vLLM keyring files carry the shown (24-bit) fingerprint; files written before the cut,
with the 64-bit check value, still load, and their entries show the 24-bit one."""

from __future__ import annotations

import pytest

from service.engines.vllm import keyring as keyring_file
from watermark.key import WatermarkKey, check_value, fingerprint

KEY = WatermarkKey(0x0123_4567_89AB_CDEF)


@pytest.mark.parametrize("printed", [fingerprint(KEY.secret), check_value(KEY.secret)])
def test_a_keyring_entry_loads_with_either_fingerprint_form(tmp_path, printed):
    path = keyring_file.write_keyring(tmp_path / "keyring.json",
                                      [keyring_file.KeyringEntry("key_a", "acme", 1, printed, KEY)])
    entry = keyring_file.read_keyring(path)["key_a"]
    assert entry.fingerprint == fingerprint(KEY.secret) and entry.key == KEY


def test_a_wrong_fingerprint_is_still_refused(tmp_path):
    path = keyring_file.write_keyring(tmp_path / "keyring.json",
                                      [keyring_file.KeyringEntry("key_a", "acme", 1, "000000", KEY)])
    with pytest.raises(keyring_file.KeyringError, match="does not match its fingerprint"):
        keyring_file.read_keyring(path)

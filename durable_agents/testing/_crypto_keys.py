"""Key rings for tests only: fixed, committed, and never to be used for anything real.

``TEST_ONLY_PAYLOAD_KEYS`` encrypted ``tests/histories/encrypted_approvals.json`` (see
``scripts/record_histories.py``); the others are as fixed and as public.
"""

from __future__ import annotations

import base64

from activities.crypto.keyring import KeyRing


def _key(text: bytes) -> str:
    assert len(text) == 32
    return base64.b64encode(text).decode()


TEST_ONLY_K1 = f"test-k1:{_key(b'durable-agents-test-only-key-001')}"
TEST_ONLY_K2 = f"test-k2:{_key(b'durable-agents-test-only-key-002')}"
# The same id as TEST_ONLY_K1 with other key bytes: what a worker with the wrong key holds.
TEST_ONLY_WRONG_K1 = f"test-k1:{_key(b'durable-agents-WRONG-test-key-01')}"
TEST_ONLY_PAYLOAD_KEYS = TEST_ONLY_K1


def ring(text: str) -> KeyRing:
    return KeyRing.parse(text)

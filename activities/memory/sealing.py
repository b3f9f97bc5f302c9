"""Memory at rest under the payload key ring (``AGENT_PAYLOAD_KEYS``): sealed text and a keyed term index.

When a key ring is configured, an entry's text is one AES-256-GCM ciphertext (``da.mem1:<key id>:<base64>``)
bound to its namespace, so it cannot be moved to another namespace and read there. Full-text indexes would
hold the words in the clear, so sealed entries are not in them; search goes through ``memory_terms``
instead: one row per (entry, term) holding ``HMAC-SHA256(k, namespace, term)`` and the term's frequency,
where ``k`` is derived from a ring key for this use only. A query's terms are hashed the same way (under
every key of the ring, so entries saved before a rotation are still found) and scored BM25-style in SQL.

What the index reveals to someone who reads the database without the key: which entries of one namespace
share a term (the same hash), how often a term occurs in an entry, each entry's number of terms and the
size of its text. Not the terms themselves, and not whether two namespaces share a term (the namespace
is part of each hash). Keys, namespaces (tenant and user names) and times stay plaintext.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

from activities.crypto.keyring import KeyRing, KeyRingError
from activities.memory.base import MemoryStoreError
from activities.store.base import StoreError

MARK = "da.mem1:"
_CONTEXT = b"memory"
_TERMS_LABEL = b"memory-terms"


class Sealer:
    """Seals and opens one namespace's texts and hashes its terms, with ``keyring``."""

    def __init__(self, keyring: KeyRing) -> None:
        self.keyring = keyring
        self._term_keys = {key_id: keyring.derive(_TERMS_LABEL, key_id) for key_id in keyring.ids}

    @staticmethod
    def _namespace(tenant: str, user: str) -> bytes:
        return json.dumps([tenant, user], separators=(",", ":")).encode()

    def seal(self, tenant: str, user: str, text: str) -> str:
        key_id, sealed = self.keyring.encrypt(text.encode(), _CONTEXT + b"|" + self._namespace(tenant, user))
        return f"{MARK}{key_id}:{base64.b64encode(sealed).decode()}"

    def open(self, tenant: str, user: str, stored: str, key: str) -> str:
        if not stored.startswith(MARK):
            return stored  # saved before encryption was turned on
        key_id, _, encoded = stored[len(MARK) :].partition(":")
        try:
            sealed = base64.b64decode(encoded, validate=True)
            plain = self.keyring.decrypt(key_id, sealed, _CONTEXT + b"|" + self._namespace(tenant, user))
        except (binascii.Error, ValueError, KeyRingError) as exc:
            raise StoreError(f"cannot decrypt memory entry {key!r}: {exc}") from None
        try:
            return plain.decode()
        except UnicodeDecodeError:
            raise MemoryStoreError(f"memory entry {key!r} does not decode as text") from None

    def term_hash(self, tenant: str, user: str, term: str, key_id: str | None = None) -> bytes:
        """The index's name for ``term`` in this namespace, under key ``key_id`` (default: the primary)."""
        key = self._term_keys[key_id or self.keyring.primary]
        return hmac.new(key, self._namespace(tenant, user) + b"\x00" + term.encode(), hashlib.sha256).digest()

    def query_hashes(self, tenant: str, user: str, term: str) -> list[bytes]:
        """``term``'s hashes under every key of the ring (entries saved before a rotation keep theirs)."""
        return [self.term_hash(tenant, user, term, key_id) for key_id in self.keyring.ids]

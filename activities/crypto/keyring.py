"""A ring of AES-256-GCM keys: the first one encrypts, any of them decrypts.

Text form (``AGENT_PAYLOAD_KEYS``, or the file ``AGENT_PAYLOAD_KEYS_FILE`` names)::

    k2:<base64 of 32 bytes>,k1:<base64 of 32 bytes>

Every ciphertext records the id of the key that made it, so a ring ``k2,k1``
reads what ``k1`` wrote and writes with ``k2``: keys rotate without breaking
running or old runs. Each encryption takes a fresh random 96-bit nonce; the
associated data names what the ciphertext is (a payload, a transcript entry, a
blob) and the key id, so a ciphertext cannot be passed off as another kind.

Parse errors never quote key material: they name the entry by position and id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Imported where a ring is built or opens a ciphertext: cryptography's Rust extension is ~6 MB of a
    # worker's memory, and a worker without encryption configured never builds a ring.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_KEY_ID = 64
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1," + str(MAX_KEY_ID) + r"}")


class KeyRingError(Exception):
    """A ciphertext cannot be decrypted: its key is not in the ring, or it is not what that key made."""


class UnknownKey(KeyRingError):
    """The ciphertext names a key id that the ring does not hold."""


@dataclass(frozen=True)
class _Key:
    key_id: str
    text: str = field(repr=False)  # the base64 text as configured (redacted from logs)
    aead: AESGCM = field(repr=False, compare=False)
    nonce_key: bytes = field(repr=False, compare=False)  # for deterministic (synthetic-nonce) encryption


class KeyRing:
    """Ordered AES-256-GCM keys by id; ``primary`` (the first) encrypts. Its ``repr`` shows ids only."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise ValueError("a key ring needs at least one key")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._keys: dict[str, _Key] = {}
        for key_id, material in keys:
            if key_id in self._keys:
                raise ValueError(f"duplicate key id {key_id!r}")
            if len(material) != KEY_BYTES:
                raise ValueError(f"key {key_id!r} is {len(material)} bytes, not {KEY_BYTES}")
            text = base64.b64encode(material).decode()
            nonce_key = hmac.new(material, b"durable-agents/v1|synthetic-nonce", hashlib.sha256).digest()
            self._keys[key_id] = _Key(key_id, text, AESGCM(material), nonce_key)
        self.primary = next(iter(self._keys))

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        """The ring written as ``id:base64,id:base64``; ``ValueError`` (one line, no key material) otherwise."""
        entries = [part.strip() for part in text.split(",")]
        if not text.strip():
            raise ValueError("no keys: expected id:<base64 of 32 bytes>[,id:<base64>...]")
        keys: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        for number, entry in enumerate(entries, 1):
            if not entry:
                raise ValueError(f"entry {number} is empty")
            key_id, sep, encoded = entry.partition(":")
            key_id, encoded = key_id.strip(), encoded.strip()
            if not sep or not key_id:
                raise ValueError(f"entry {number} is not id:<base64 key>")
            if not _KEY_ID.fullmatch(key_id):
                raise ValueError(
                    f"entry {number}: key id must be 1-{MAX_KEY_ID} characters of letters, digits, '.', '_', '-'"
                )
            if key_id in seen:
                raise ValueError(f"entry {number}: duplicate key id {key_id!r}")
            seen.add(key_id)
            try:
                material = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"entry {number} (key id {key_id!r}): the key is not valid base64") from None
            if len(material) != KEY_BYTES:
                raise ValueError(
                    f"entry {number} (key id {key_id!r}): the key is {len(material)} bytes, not {KEY_BYTES}"
                )
            keys.append((key_id, material))
        return cls(keys)

    @staticmethod
    def generate_text(key_id: str = "k1") -> str:
        """A new ring entry ``key_id:<base64 of 32 random bytes>``."""
        return f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing(ids={list(self._keys)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyRing) and [(k.key_id, k.text) for k in self._keys.values()] == [
            (k.key_id, k.text) for k in other._keys.values()
        ]

    def __hash__(self) -> int:
        return hash(self.ids)

    def secret_values(self) -> list[str]:
        """The keys' base64 texts, for redaction."""
        return [key.text for key in self._keys.values()]

    def derive(self, label: bytes, key_id: str | None = None) -> bytes:
        """A 32-byte key for ``label`` (one use, e.g. memory's term index), derived from key ``key_id`` (default:
        the primary) by HMAC-SHA256: it reveals nothing of the key, and another label gets an unrelated one."""
        key = self._keys[key_id or self.primary]
        return hmac.new(base64.b64decode(key.text), b"durable-agents/v1|derive|" + label, hashlib.sha256).digest()

    def encrypt(self, plaintext: bytes, context: bytes, *, deterministic: bool = False) -> tuple[str, bytes]:
        """``(key id, nonce + ciphertext + tag)`` of ``plaintext`` under the primary key, bound to ``context``.

        The nonce is random, or with ``deterministic`` an HMAC of the plaintext (a synthetic nonce, as in SIV):
        the same bytes then encrypt to the same ciphertext under one key, which content addressing needs, and
        reveal only that two ciphertexts hold the same bytes.
        """
        key = self._keys[self.primary]
        if deterministic:
            nonce = hmac.new(key.nonce_key, context + b"|" + plaintext, hashlib.sha256).digest()[:NONCE_BYTES]
        else:
            nonce = os.urandom(NONCE_BYTES)
        return key.key_id, nonce + key.aead.encrypt(nonce, plaintext, _aad(context, key.key_id))

    def decrypt(self, key_id: str, sealed: bytes, context: bytes) -> bytes:
        """The plaintext of ``sealed`` made by key ``key_id`` for ``context``; ``KeyRingError`` otherwise."""
        key = self._keys.get(key_id)
        if key is None:
            raise UnknownKey(f"encrypted with key {key_id!r}, which is not in the key ring ({', '.join(self.ids)})")
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            raise KeyRingError(f"a ciphertext of key {key_id!r} is too short ({len(sealed)} bytes)")
        from cryptography.exceptions import InvalidTag

        try:
            return key.aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _aad(context, key_id))
        except InvalidTag:
            raise KeyRingError(
                f"a ciphertext of key {key_id!r} does not authenticate: a different key under that id, or tampered"
            ) from None


def _aad(context: bytes, key_id: str) -> bytes:
    return b"durable-agents/v1|" + context + b"|" + key_id.encode()

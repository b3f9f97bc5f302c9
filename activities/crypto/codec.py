"""``AesGcmCodec``: the Temporal payload codec that encrypts every payload with the key ring.

An encrypted payload is::

    metadata: {"encoding": b"binary/encrypted", "encryption-key-id": b"k2"}
    data:     nonce (12 bytes) + AES-256-GCM(the original Payload, serialized) + tag

Decoding leaves payloads that are not ``binary/encrypted`` as they are, so
histories recorded before encryption was turned on still replay, and it raises
``KeyRingError`` (which fails the workflow task, visibly, and is retried) for a
payload whose key is not in the ring or does not authenticate.

The SDK runs the codec over workflow and activity inputs and results, signals,
updates, queries, memos, user metadata (summaries and details) and, with
:func:`encrypted_converter`'s failure converter, failure messages and stack
traces. It never runs it over search attributes, and headers only when asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec

from activities.crypto.keyring import KeyRing, KeyRingError

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_CONTEXT = b"payload"


class AesGcmCodec(PayloadCodec):
    """Encrypts with the ring's primary key; decrypts with whichever key a payload names."""

    def __init__(self, keyring: KeyRing) -> None:
        self.keyring = keyring

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encode_one(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decode_one(p) for p in payloads]

    def encode_one(self, payload: Payload) -> Payload:
        key_id, sealed = self.keyring.encrypt(payload.SerializeToString(), _CONTEXT)
        return Payload(metadata={"encoding": ENCODING, KEY_ID: key_id.encode()}, data=sealed)

    def decode_one(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID, b"").decode("utf-8", "replace")
        if not key_id:
            raise KeyRingError("an encrypted payload names no encryption-key-id")
        inner = Payload()
        inner.ParseFromString(self.keyring.decrypt(key_id, payload.data, _CONTEXT))
        return inner


class PayloadsEncrypted(Exception):
    """A payload is encrypted (``binary/encrypted``) and this process has no key ring to read it."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"a payload is encrypted (key id {key_id or '?'}) and no key ring is configured")
        self.key_id = key_id


class KeylessCodec(PayloadCodec):
    """The codec of a process without keys: plaintext passes both ways; reading an encrypted
    payload raises :class:`PayloadsEncrypted` (instead of the SDK's ``KeyError`` about an unknown encoding)."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        for payload in payloads:
            if payload.metadata.get("encoding") == ENCODING:
                raise PayloadsEncrypted(payload_key_id(payload) or "")
        return list(payloads)


def payload_key_id(payload: Payload) -> str | None:
    """The key id an encrypted payload names, or ``None`` for a plaintext payload."""
    if payload.metadata.get("encoding") != ENCODING:
        return None
    return payload.metadata.get(KEY_ID, b"").decode("utf-8", "replace")


def encrypted_converter(base: DataConverter, keyring: KeyRing | None) -> DataConverter:
    """``base`` with the key ring's codec (outermost, after any codec ``base`` has) and failure messages
    moved into the encrypted attributes; ``base`` itself when ``keyring`` is ``None``."""
    if keyring is None:
        return base
    existing = base.payload_codec
    if isinstance(existing, AesGcmCodec) and existing.keyring == keyring:
        return base
    codec: PayloadCodec = AesGcmCodec(keyring)
    if existing is not None and not isinstance(existing, AesGcmCodec):
        codec = _Chain(existing, codec)
    failures = base.failure_converter_class
    if failures is DataConverter.default.failure_converter_class:
        failures = DefaultFailureConverterWithEncodedAttributes
    return dataclasses.replace(base, payload_codec=codec, failure_converter_class=failures)


class _Chain(PayloadCodec):
    """Another codec first (e.g. compression), then encryption; decoding in reverse."""

    def __init__(self, inner: PayloadCodec, outer: PayloadCodec) -> None:
        self.inner, self.outer = inner, outer

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return await self.outer.encode(await self.inner.encode(payloads))

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return await self.inner.decode(await self.outer.decode(payloads))

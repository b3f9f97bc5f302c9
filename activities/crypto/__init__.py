"""AES-256-GCM with a key ring: Temporal payloads (``codec``) and the run store (``activities.store.encrypted``)."""

from activities.crypto.keyring import KeyRing, KeyRingError, UnknownKey

__all__ = ["KeyRing", "KeyRingError", "UnknownKey"]

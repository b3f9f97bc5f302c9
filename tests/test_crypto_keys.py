"""The key ring, its configuration (``AGENT_PAYLOAD_KEYS*``) and the payload codec, without a server."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from activities.crypto.codec import ENCODING, KEY_ID, AesGcmCodec, encrypted_converter, payload_key_id
from activities.crypto.keyring import KeyRingError, UnknownKey
from activities.settings import ConfigurationError, Settings
from tests.crypto_keys import TEST_ONLY_K1, TEST_ONLY_K2, TEST_ONLY_WRONG_K1, ring
from workflows.inputs import ENCRYPTED_ENCODING, EncryptedPayload, decode
from workflows.types import AgentInput

GOOD = base64.b64encode(b"a-fixed-test-only-key-of-32-byte").decode()  # fixed: xdist workers collect the same ids


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no keys"),
        ("   ", "no keys"),
        ("k1", "entry 1 is not id:<base64 key>"),
        (":" + GOOD, "entry 1 is not id:<base64 key>"),
        (f"k1:{GOOD},", "entry 2 is empty"),
        ("k1:not base64!", "entry 1 (key id 'k1'): the key is not valid base64"),
        (f"k1:{base64.b64encode(b'sixteen-byte-key').decode()}", "the key is 16 bytes, not 32"),
        (f"k1:{GOOD},k1:{GOOD}", "entry 2: duplicate key id 'k1'"),
        (f"k 1:{GOOD}", "key id must be"),
    ],
    ids=["empty", "blank", "no-colon", "no-id", "trailing-comma", "not-base64", "16-bytes", "duplicate", "bad-id"],
)
def test_bad_key_text_is_one_line_without_key_material(text: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        Settings.from_env({"AGENT_PAYLOAD_KEYS": text})
    message = str(err.value)
    assert message.startswith("AGENT_PAYLOAD_KEYS: ") and problem in message
    assert "\n" not in message and GOOD not in message and "not base64!" not in message


def test_keys_from_a_file_and_not_both(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{TEST_ONLY_K2},{TEST_ONLY_K1}\n")
    keyring = Settings.from_env({"AGENT_PAYLOAD_KEYS_FILE": str(path)}).encryption.keyring
    assert keyring is not None and keyring.ids == ("test-k2", "test-k1") and keyring.primary == "test-k2"
    with pytest.raises(ConfigurationError, match="not both"):
        Settings.from_env({"AGENT_PAYLOAD_KEYS_FILE": str(path), "AGENT_PAYLOAD_KEYS": TEST_ONLY_K1})
    with pytest.raises(ConfigurationError, match=r"AGENT_PAYLOAD_KEYS_FILE=.*missing: cannot read it"):
        Settings.from_env({"AGENT_PAYLOAD_KEYS_FILE": str(tmp_path / "missing")})
    path.write_text("\n")
    with pytest.raises(ConfigurationError, match="no keys"):
        Settings.from_env({"AGENT_PAYLOAD_KEYS_FILE": str(path)})


def test_no_keys_means_no_encryption() -> None:
    settings = Settings.from_env({})
    assert settings.encryption.keyring is None and not settings.encryption.enabled
    assert encrypted_converter(pydantic_data_converter, None) is pydantic_data_converter


def test_key_material_and_the_codec_token_are_secrets() -> None:
    settings = Settings.from_env({"AGENT_PAYLOAD_KEYS": f"{TEST_ONLY_K2},{TEST_ONLY_K1}", "AGENT_CODEC_TOKEN": "tok3n"})
    secrets = settings.secret_values()
    assert TEST_ONLY_K1.split(":")[1] in secrets and TEST_ONLY_K2.split(":")[1] in secrets and "tok3n" in secrets
    assert TEST_ONLY_K1.split(":")[1] not in repr(settings)


def test_codec_settings() -> None:
    settings = Settings.from_env({"AGENT_UI_CODEC_ENDPOINT": "http://127.0.0.1:8081/", "AGENT_CODEC_CORS_ORIGINS": ""})
    assert settings.encryption.ui_codec_endpoint == "http://127.0.0.1:8081"
    assert settings.encryption.codec_origins == ("http://localhost:8233", "http://127.0.0.1:8233")
    with pytest.raises(ConfigurationError, match="AGENT_UI_CODEC_ENDPOINT"):
        Settings.from_env({"AGENT_UI_CODEC_ENDPOINT": "localhost:8081"})


def test_rotation_any_key_decrypts_the_first_encrypts() -> None:
    old, rotated = ring(TEST_ONLY_K1), ring(f"{TEST_ONLY_K2},{TEST_ONLY_K1}")
    key_id, sealed = old.encrypt(b"secret", b"ctx")
    assert key_id == "test-k1" and rotated.decrypt(key_id, sealed, b"ctx") == b"secret"
    assert rotated.encrypt(b"secret", b"ctx")[0] == "test-k2"
    with pytest.raises(UnknownKey, match="'test-k1', which is not in the key ring"):
        ring(TEST_ONLY_K2).decrypt(key_id, sealed, b"ctx")
    with pytest.raises(KeyRingError, match="does not authenticate"):
        ring(TEST_ONLY_WRONG_K1).decrypt(key_id, sealed, b"ctx")
    with pytest.raises(KeyRingError, match="does not authenticate"):
        old.decrypt(key_id, sealed, b"other context")
    assert old.encrypt(b"x", b"c")[1] != old.encrypt(b"x", b"c")[1]
    assert old.encrypt(b"x", b"c", deterministic=True) == old.encrypt(b"x", b"c", deterministic=True)
    assert "durable" not in repr(old) and repr(old) == "KeyRing(ids=['test-k1'])"


async def test_codec_round_trip_and_plaintext_passes() -> None:
    codec = AesGcmCodec(ring(TEST_ONLY_K1))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"MARKER"')
    [sealed] = await codec.encode([plain])
    assert sealed.metadata["encoding"] == ENCODING == ENCRYPTED_ENCODING
    assert sealed.metadata[KEY_ID] == b"test-k1" and payload_key_id(sealed) == "test-k1"
    assert b"MARKER" not in sealed.SerializeToString()
    assert await codec.decode([sealed, plain]) == [plain, plain]
    with pytest.raises(KeyRingError):
        await AesGcmCodec(ring(TEST_ONLY_K2)).decode([sealed])


async def test_converter_encrypts_values_and_failure_messages() -> None:
    converter = encrypted_converter(pydantic_data_converter, ring(TEST_ONLY_K1))
    assert encrypted_converter(converter, ring(TEST_ONLY_K1)) is converter
    [payload] = await converter.encode([AgentInput(task="MARKER task")])
    assert b"MARKER" not in payload.SerializeToString()
    assert (await converter.decode([payload], [AgentInput]))[0].task == "MARKER task"
    failure = Failure()
    await converter.encode_failure(ApplicationError("MARKER in an error"), failure)
    assert b"MARKER" not in failure.SerializeToString()
    assert "MARKER in an error" in str(await converter.decode_failure(failure))


def test_a_keyless_worker_fails_the_task_instead_of_refusing_the_input() -> None:
    from temporalio.common import RawValue

    sealed = Payload(metadata={"encoding": ENCODING, KEY_ID: b"k7"}, data=b"x" * 40)
    with pytest.raises(EncryptedPayload, match="key 'k7' reached a worker without that key"):
        decode(RawValue(sealed), AgentInput)

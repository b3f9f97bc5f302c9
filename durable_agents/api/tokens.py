"""Tenant tokens: who a bearer token is (``AGENT_API_TOKENS_FILE``), re-read when the file changes.

The file holds only SHA-256 digests of the tokens, never a token:
``{"tokens": [{"sha256": "<hex>", "tenant": "acme", "roles": ["starter", "reviewer"], "reviewer": "alice"}]}``.
A request's token is hashed and compared with every entry through ``hmac.compare_digest`` (no early
exit on the first differing byte, so response times say nothing about how close a guess was).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

Role = Literal["starter", "reviewer", "admin"]
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_TOKEN_CHARS = 4096


class TokenError(ValueError):
    """The tokens file is unreadable or invalid; one line naming the file."""


class Token(BaseModel):
    """One entry of the tokens file: the identity a bearer token stands for."""

    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    tenant: str = Field(default="", max_length=200)  # empty only for an admin token
    roles: list[Role] = Field(default_factory=list)
    reviewer: str = Field(default="", max_length=200)  # the name decisions are recorded under

    def has(self, role: Role) -> bool:
        return role in self.roles or "admin" in self.roles

    @property
    def admin(self) -> bool:
        return "admin" in self.roles


class TokensFile(BaseModel):
    tokens: list[Token] = Field(default_factory=list, max_length=100_000)


def digest(token: str) -> str:
    """The hex SHA-256 the tokens file holds for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse(text: str, where: str) -> list[Token]:
    try:
        tokens = TokensFile.model_validate(json.loads(text)).tokens
    except (json.JSONDecodeError, ValidationError) as exc:
        first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else exc.msg
        raise TokenError(f"{where}: not a tokens file ({first})") from None
    for entry in tokens:
        if not entry.admin and not entry.tenant:
            raise TokenError(f"{where}: a token without the admin role needs a tenant")
    return tokens


class TokenRegistry:
    """The tokens of one file; ``lookup`` re-reads it when its mtime, size or inode changed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: list[Token] = []
        self.reload()  # a bad file at start is an error the operator sees, not a 401 for everyone

    def reload(self) -> None:
        try:
            stat = os.stat(self.path)
            if stat.st_size > MAX_FILE_BYTES:
                raise TokenError(f"AGENT_API_TOKENS_FILE={self.path}: larger than {MAX_FILE_BYTES} bytes")
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenError(f"AGENT_API_TOKENS_FILE={self.path}: cannot read it ({type(exc).__name__})") from None
        tokens = parse(text, f"AGENT_API_TOKENS_FILE={self.path}")
        with self._lock:
            self._tokens = tokens
            self._stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def _refresh(self) -> None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return  # a file being replaced: keep the tokens we have
        if (stat.st_mtime_ns, stat.st_size, stat.st_ino) != self._stamp:
            try:
                self.reload()
            except TokenError:
                # A half-written or broken file: keep serving with the last good tokens.
                with self._lock:
                    self._stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def lookup(self, bearer: str) -> Token | None:
        """The entry of ``bearer`` (the token itself), or None."""
        if not bearer or len(bearer) > MAX_TOKEN_CHARS:
            return None
        self._refresh()
        wanted = digest(bearer).encode()
        found: Token | None = None
        with self._lock:
            tokens = self._tokens
        for entry in tokens:
            if hmac.compare_digest(entry.sha256.lower().encode(), wanted):
                found = entry
        return found


def local_token(reviewer: str = "local") -> Token:
    """What every request is under ``--insecure-local`` (no tokens file): an admin on this machine."""
    return Token(sha256="0" * 64, tenant="", roles=["admin"], reviewer=reviewer)

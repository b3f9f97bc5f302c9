"""Worker settings read from the environment (the public contract's variable names).

Secrets are held as ``pydantic.SecretStr`` so that a settings object printed or
logged by accident shows ``**********`` instead of a key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

DEFAULT_STATE_DIR = Path(".agent")


def _secret(name: str) -> SecretStr | None:
    value = os.environ.get(name, "").strip()
    return SecretStr(value) if value else None


def _host_list(raw: str) -> tuple[str, ...]:
    return tuple(h.strip().lower() for h in raw.split(",") if h.strip())


@dataclass(frozen=True)
class Settings:
    task_queue: str = "agents"
    model: str = ""
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: SecretStr | None = None
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: SecretStr | None = None
    sandbox: str = "local"
    e2b_api_key: SecretStr | None = None
    http_allow: tuple[str, ...] = ()
    store_url: str = str(DEFAULT_STATE_DIR / "store.sqlite3")
    state_dir: Path = DEFAULT_STATE_DIR
    prices_file: str = ""
    policy_file: str = ""
    approval_key: SecretStr | None = None
    reap_interval_s: float = 600.0  # 0: the worker never reaps sandboxes

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        openai_key = _secret("OPENAI_API_KEY")
        anthropic_key = _secret("ANTHROPIC_API_KEY")
        e2b_key = _secret("E2B_API_KEY")
        state_dir = Path(env.get("AGENT_STATE_DIR", str(DEFAULT_STATE_DIR)))
        return cls(
            task_queue=env.get("AGENT_TASK_QUEUE", "agents"),
            model=env.get("AGENT_MODEL", "").strip() or default_model(openai_key, anthropic_key),
            openai_base_url=env.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/"),
            openai_api_key=openai_key,
            anthropic_base_url=env.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com").rstrip("/"),
            anthropic_api_key=anthropic_key,
            sandbox=env.get("AGENT_SANDBOX", "").strip() or ("e2b" if e2b_key else "local"),
            e2b_api_key=e2b_key,
            http_allow=_host_list(env.get("AGENT_HTTP_ALLOW", "")),
            store_url=env.get("AGENT_STORE_URL", "").strip() or str(state_dir / "store.sqlite3"),
            state_dir=state_dir,
            prices_file=env.get("AGENT_PRICES", ""),
            policy_file=env.get("AGENT_POLICY_FILE", ""),
            approval_key=_secret("AGENT_APPROVAL_KEY"),
            reap_interval_s=_seconds("AGENT_REAP_INTERVAL_S", 600.0),
        )

    def secret_values(self) -> list[str]:
        """Every configured secret (API keys, the approval key, the store URL's password), for redaction."""
        keys = [
            s.get_secret_value()
            for s in (self.openai_api_key, self.anthropic_api_key, self.e2b_api_key, self.approval_key)
            if s is not None and s.get_secret_value()
        ]
        return [*keys, url_password(self.store_url)] if url_password(self.store_url) else keys


def url_password(url: str) -> str:
    try:
        return urlsplit(url).password or ""
    except ValueError:
        return ""


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds (0 or more)")
    return value


def default_model(openai_key: SecretStr | None, anthropic_key: SecretStr | None) -> str:
    """``AGENT_MODEL`` when unset: a real provider when its key exists, else the offline script."""
    if openai_key is not None:
        return "openai:gpt-4o-mini"
    if anthropic_key is not None:
        return "anthropic:claude-sonnet-4-5"
    return "scripted:demo"


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[REDACTED]")
    return text

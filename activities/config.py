"""Worker settings read from the environment (the public contract's variable names).

Secrets are held as ``pydantic.SecretStr`` so that a settings object printed or
logged by accident shows ``**********`` instead of a key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

DEFAULT_STATE_DIR = Path(".agent")


def _secret(name: str) -> SecretStr | None:
    value = os.environ.get(name, "").strip()
    return SecretStr(value) if value else None


def _host_list(raw: str) -> tuple[str, ...]:
    return tuple(h.strip().lower() for h in raw.split(",") if h.strip())


@dataclass(frozen=True)
class Settings:
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = "default"
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
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        openai_key = _secret("OPENAI_API_KEY")
        anthropic_key = _secret("ANTHROPIC_API_KEY")
        e2b_key = _secret("E2B_API_KEY")
        state_dir = Path(env.get("AGENT_STATE_DIR", str(DEFAULT_STATE_DIR)))
        return cls(
            temporal_address=env.get("TEMPORAL_ADDRESS", "localhost:7233"),
            temporal_namespace=env.get("TEMPORAL_NAMESPACE", "default"),
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
        )

    def secret_values(self) -> list[str]:
        """Every configured secret, for redaction of error text."""
        return [
            s.get_secret_value()
            for s in (self.openai_api_key, self.anthropic_api_key, self.e2b_api_key, self.approval_key)
            if s is not None and s.get_secret_value()
        ]


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

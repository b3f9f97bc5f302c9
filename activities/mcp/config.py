"""The operator's MCP servers: ``AGENT_MCP_CONFIG`` names a JSON file in the format Claude Desktop,
Cursor and VS Code use::

    {"mcpServers": {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        "shop": {"url": "https://shop.example/mcp", "headers": {"Authorization": "Bearer ${SHOP_TOKEN}"},
                 "recovery": "idempotent_by_key"}}}

A server has either ``command`` (stdio: a process the worker starts) or ``url`` (Streamable HTTP).
Values in ``env`` and ``headers`` may reference the worker's environment as ``${VAR}`` (or
``${VAR:-default}``), so that keys never sit in the file; every value that came from a reference
there, and every header value, is treated as a secret (redacted from logs, tool results and
history). ``command``, ``args``, ``cwd`` and ``url`` may use references too (for paths; their values
are not treated as secrets). A ``per_run`` server's ``env`` and ``headers`` values may also name the
run's tenant's credentials as ``${secret:NAME}`` (:mod:`activities.tenant_secrets`), resolved when the
server starts for a run; a shared server refuses them at load, since it serves every tenant. A
``command`` without a ``/`` is looked up on the worker's ``PATH`` at load, then beside the running
Python (a venv's ``bin``, activated or not), and started by its absolute path.

Our own fields, all optional: ``recovery`` (``unknown`` or ``idempotent_by_key``, for the server or
per tool), ``per_run`` (one process per run, for stateful servers), ``timeout_s`` (of a call),
``startup_timeout_s``, ``max_result_chars``, ``disabled``, and ``tools`` with per-tool ``recovery``,
``read_only`` (overrides the server's ``readOnlyHint``) and ``timeout_s``. Anything else is refused
by name, so a typo cannot silently change what a tool is allowed to do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from activities.redaction import learn
from activities.settings import ConfigurationError, Settings
from activities.tenant_secrets import SecretUnavailable, check_name, expand, references
from workflows.known_keys import KnownKeys

VARIABLE = "AGENT_MCP_CONFIG"
SERVER_NAME_PATTERN = r"^[A-Za-z0-9-]([A-Za-z0-9_-]{0,30}[A-Za-z0-9-])?$"  # no "__": it separates name parts
MAX_CONFIG_BYTES = 1024 * 1024
MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

Recovery = Literal["idempotent_by_key", "unknown"]


class McpToolOptions(KnownKeys):
    """What the operator says about one tool of a server, over what the server says about it."""

    recovery: Recovery | None = None
    read_only: bool | None = None  # None: the server's readOnlyHint decides
    timeout_s: int | None = Field(default=None, ge=1, le=3600)


class McpServerConfig(KnownKeys):
    type: Literal["stdio", "http", "streamable-http", "streamableHttp"] | None = None
    command: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: dict[str, str] = Field(default_factory=dict)
    disabled: bool = False
    per_run: bool = False
    recovery: Recovery = "unknown"
    timeout_s: int = Field(default=60, ge=1, le=3600)
    startup_timeout_s: int = Field(default=20, ge=1, le=600)
    max_result_chars: int = Field(default=100_000, ge=1000, le=10_000_000)
    tools: dict[str, McpToolOptions] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("give either 'command' (a stdio server) or 'url' (a Streamable HTTP server)")
        if self.type == "stdio" and not self.command:
            raise ValueError("type 'stdio' needs 'command'")
        if self.type not in (None, "stdio") and not self.url:
            raise ValueError(f"type {self.type!r} needs 'url'")
        if self.url and not re.match(r"^https?://", self.url):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        if self.url and (self.env or self.args or self.cwd):
            raise ValueError("'env', 'args' and 'cwd' are for stdio servers ('command'), not 'url'")
        if self.command and self.headers:
            raise ValueError("'headers' are for Streamable HTTP servers ('url'), not 'command'")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command else "http"

    def options(self, tool: str) -> McpToolOptions:
        return self.tools.get(tool) or McpToolOptions()

    def recovery_of(self, tool: str) -> Recovery:
        return self.options(tool).recovery or self.recovery

    def timeout_of(self, tool: str) -> int:
        return self.options(tool).timeout_s or self.timeout_s


class McpConfigFile(KnownKeys):
    mcpServers: dict[str, McpServerConfig] = Field(default_factory=dict)


class McpConfig:
    """The enabled servers with ``${VAR}`` references resolved, and the secret values they carry."""

    def __init__(self, servers: dict[str, McpServerConfig] | None = None, secrets: tuple[str, ...] = ()) -> None:
        self.servers = servers or {}
        self.secrets = secrets

    def __bool__(self) -> bool:
        return bool(self.servers)

    def server(self, name: str) -> McpServerConfig | None:
        return self.servers.get(name)


def load_mcp_config(settings: Settings) -> McpConfig:
    """The servers of ``settings.mcp_config`` (none when unset); one-line ``ConfigurationError`` otherwise.

    Refused at load (so the worker stops at start, exit 2): a file that cannot be read or is not JSON,
    an unknown field, a bad server name, a server with neither or both of ``command`` and ``url``, a
    ``${VAR}`` that is not set, and a ``command`` that is not an executable on the worker's ``PATH``.
    """
    path = settings.mcp_config
    if not path:
        return McpConfig()
    where = f"{VARIABLE}={path}"
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigurationError(f"{where}: {len(raw)} bytes; the limit is {MAX_CONFIG_BYTES}")
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{where}: not valid JSON ({exc})") from None
    try:
        parsed = McpConfigFile.model_validate(document)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = ".".join(str(part) for part in first["loc"]) or "(file)"
        raise ConfigurationError(f"{where}: {location}: {first['msg']}") from None
    if parsed.mcpServers:
        from activities.extras import require

        require("mcp", "mcp", f"{where} (MCP servers)")
    servers: dict[str, McpServerConfig] = {}
    secrets: list[str] = []
    for name, server in parsed.mcpServers.items():
        if not re.match(SERVER_NAME_PATTERN, name) or "__" in name:
            raise ConfigurationError(
                f"{where}: mcpServers.{name}: a server name is 1-32 letters, digits, '-' or '_' (no '__')"
            )
        if server.disabled:
            continue
        at = f"{where}: mcpServers.{name}"
        _check_secret_references(server, at)
        env = {key: _expand(value, settings, f"{at}.env.{key}", secrets) for key, value in server.env.items()}
        headers = {}
        for key, value in server.headers.items():
            headers[key] = _expand(value, settings, f"{at}.headers.{key}", secrets)
            if not references(headers[key]):  # one with ``${secret:}`` is learned whole when it is resolved
                secrets.append(headers[key])
        # Paths and addresses may use the environment too; those values are not secrets (keys belong in env/headers).
        plain: list[str] = []
        resolved = server.model_copy(
            update={
                "env": env,
                "headers": headers,
                "command": _expand(server.command, settings, f"{at}.command", plain),
                "args": [_expand(arg, settings, f"{at}.args", plain) for arg in server.args],
                "cwd": _expand(server.cwd, settings, f"{at}.cwd", plain),
                "url": _expand(server.url, settings, f"{at}.url", plain),
            }
        )
        if resolved.command:
            resolved = resolved.model_copy(update={"command": _executable(resolved, settings, f"{at}.command")})
        servers[name] = resolved
    return McpConfig(servers, tuple(s for s in dict.fromkeys(secrets) if len(s) >= MIN_SECRET_CHARS))


def _check_secret_references(server: McpServerConfig, at: str) -> None:
    """``${secret:NAME}`` only in a ``per_run`` server's ``env`` and ``headers``, with valid names."""
    for field, values in (("env", server.env), ("headers", server.headers)):
        for key, value in values.items():
            for secret in references(value):
                try:
                    check_name(secret)
                except SecretUnavailable as exc:
                    raise ConfigurationError(f"{at}.{field}.{key}: {exc}") from None
                if not server.per_run:
                    raise ConfigurationError(
                        f"{at}.{field}.{key}: ${{secret:{secret}}} is a tenant's secret, and a shared server "
                        'serves every tenant: set "per_run": true (one process per run, for its tenant)'
                    )
    for field, value in (("command", server.command), ("cwd", server.cwd), ("url", server.url)):
        if references(value):
            raise ConfigurationError(f"{at}.{field}: ${{secret:...}} is only allowed in 'env' and 'headers' values")
    if any(references(arg) for arg in server.args):
        raise ConfigurationError(f"{at}.args: ${{secret:...}} is only allowed in 'env' and 'headers' values")


def for_tenant(server: McpServerConfig, settings: Settings, tenant: str) -> tuple[McpServerConfig, list[str]]:
    """``server`` with its ``${secret:NAME}`` values resolved for ``tenant``, and the values (each learned for
    redaction); ``SecretUnavailable`` when the tenant lacks one."""
    used: list[str] = []

    def resolve(values: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in values.items():
            if references(value):
                out[key], found = expand(value, settings, tenant)
                used.extend([*found, out[key]])
            else:
                out[key] = value
        return out

    if not any(references(v) for v in (*server.env.values(), *server.headers.values())):
        return server, used
    resolved = server.model_copy(update={"env": resolve(server.env), "headers": resolve(server.headers)})
    used = list(dict.fromkeys(used))
    learn(*used)  # a whole header value ("Bearer <token>") too, not only the token in it
    return resolved, used


def _expand(value: str, settings: Settings, where: str, secrets: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = settings.variable(name)
        if not found and default is None:
            raise ConfigurationError(f"{where}: references ${{{name}}}, which is not set in the worker's environment")
        resolved = found or (default or "")
        if found:
            secrets.append(found)
        return resolved

    return _REFERENCE.sub(replace, value)


def _executable(server: McpServerConfig, settings: Settings, where: str) -> str:
    """The command as an absolute path, found the way the worker's shell would (its ``PATH``), else beside the
    running interpreter (``mcp-server-time`` in the worker's venv, not activated), or refused."""
    command = server.command
    if os.sep in command:
        path = Path(server.cwd or ".") / command
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigurationError(f"{where}: {command!r} is not an executable file")
        return str(path.absolute())  # never resolve symlinks: a venv's python is one
    found = shutil.which(command, path=settings.variable("PATH") or None)
    if found is None:  # a console script installed beside the worker (its venv's bin), venv activated or not
        found = shutil.which(command, path=str(Path(sys.executable).parent))
    if found is None:
        raise ConfigurationError(
            f"{where}: {command!r} is not found on the worker's PATH nor beside its Python "
            f"({Path(sys.executable).parent})"
        )
    return str(Path(found).absolute())

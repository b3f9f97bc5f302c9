"""``AGENT_MCP_CONFIG``: the file format, ``${VAR}`` references, and what is refused (one line each)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from activities.mcp.config import load_mcp_config
from activities.runtime import Runtime
from activities.settings import ConfigurationError, Settings

PYTHON = sys.executable


def settings_with(tmp_path: Path, document: Any, **env: str) -> Settings:
    path = tmp_path / "mcp.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return replace(Settings(), mcp_config=str(path), environ={"PATH": str(Path(PYTHON).parent), **env})


def test_stdio_and_http_servers_with_references_resolved_and_their_values_secret(tmp_path: Path) -> None:
    settings = settings_with(
        tmp_path,
        {
            "mcpServers": {
                "files": {
                    "command": Path(PYTHON).name,
                    "args": ["-m", "server", "${WORKDIR:-/srv}"],
                    "env": {"API_KEY": "${FILES_KEY}", "MODE": "fast", "REGION": "${REGION:-eu-1}"},
                },
                "shop": {
                    "type": "http",
                    "url": "https://shop.example/mcp",
                    "headers": {"Authorization": "Bearer ${SHOP_TOKEN}"},
                    "recovery": "idempotent_by_key",
                    "tools": {"refund": {"recovery": "unknown", "timeout_s": 5}},
                },
                "off": {"command": "does-not-matter-when-disabled", "disabled": True},
            }
        },
        FILES_KEY="fk-123456789",
        SHOP_TOKEN="st-abcdefghij",
    )
    config = load_mcp_config(settings)
    assert set(config.servers) == {"files", "shop"}  # a disabled server is not loaded (nor checked)
    files, shop = config.servers["files"], config.servers["shop"]
    assert files.transport == "stdio" and Path(files.command).is_absolute()  # found on PATH, started by path
    assert files.args == ["-m", "server", "/srv"]
    assert files.env == {"API_KEY": "fk-123456789", "MODE": "fast", "REGION": "eu-1"}
    assert shop.transport == "http" and shop.headers == {"Authorization": "Bearer st-abcdefghij"}
    assert shop.recovery_of("refund") == "unknown" and shop.recovery_of("buy") == "idempotent_by_key"
    assert shop.timeout_of("refund") == 5 and shop.timeout_of("buy") == 60
    # Values from references in env, and header values, are secrets; defaults and plain values are not.
    assert "fk-123456789" in config.secrets and "Bearer st-abcdefghij" in config.secrets
    assert "fast" not in config.secrets and "eu-1" not in config.secrets and "/srv" not in config.secrets
    runtime = Runtime.from_settings(settings)
    assert "st-abcdefghij" in runtime.settings.secret_values()  # redacted wherever settings' secrets are


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ("{not json", "not valid JSON"),
        (
            {"mcpServers": {"x": {"command": PYTHON, "autoApprove": []}}},
            "mcpServers.x.autoApprove: unknown key 'autoApprove'",
        ),
        ({"servers": {}}, "servers: unknown key 'servers' (did you mean 'mcpServers'?)"),
        ({"mcpServers": {"x": {"command": "no-such-mcp-server-binary"}}}, "'no-such-mcp-server-binary' is not found"),
        ({"mcpServers": {"x": {"command": "./nope/server"}}}, "is not an executable file"),
        (
            {"mcpServers": {"x": {"command": PYTHON, "env": {"K": "${NOT_SET_VAR}"}}}},
            "${NOT_SET_VAR}, which is not set",
        ),
        ({"mcpServers": {"x": {}}}, "either 'command'"),
        ({"mcpServers": {"x": {"command": PYTHON, "url": "http://h/mcp"}}}, "either 'command'"),
        ({"mcpServers": {"x": {"url": "ftp://h/mcp"}}}, "must start with http"),
        ({"mcpServers": {"x": {"url": "http://h/mcp", "env": {"A": "b"}}}}, "are for stdio servers"),
        ({"mcpServers": {"x": {"command": PYTHON, "headers": {"A": "b"}}}}, "are for Streamable HTTP servers"),
        ({"mcpServers": {"a__b": {"command": PYTHON}}}, "no '__'"),
        ({"mcpServers": {"x": {"command": PYTHON, "recovery": "reconcile"}}}, "mcpServers.x.recovery"),
        ({"mcpServers": {"x": {"command": PYTHON, "type": "sse"}}}, "mcpServers.x.type"),
    ],
)
def test_bad_configurations_are_one_line_naming_the_variable_and_the_place(
    tmp_path: Path, document: Any, named: str
) -> None:
    settings = settings_with(tmp_path, document)
    with pytest.raises(ConfigurationError) as caught:
        Runtime.from_settings(settings)
    message = str(caught.value)
    assert message.startswith(f"AGENT_MCP_CONFIG={settings.mcp_config}: ")
    assert named in message and "\n" not in message


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    settings = replace(Settings(), mcp_config=str(tmp_path / "absent.json"))
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_mcp_config(settings)


def test_no_configuration_means_no_servers() -> None:
    config = load_mcp_config(Settings())
    assert not config and config.servers == {}


def test_a_command_is_found_on_path_then_beside_the_running_python(tmp_path: Path) -> None:
    """``mcp-server-time`` from the worker's venv starts with the venv not activated (its bin not on PATH)."""
    venv_bin = Path(PYTHON).parent
    assert (venv_bin / "mcp-server-time").exists()  # installed in the venv the tests run in
    document = {"mcpServers": {"time": {"command": "mcp-server-time"}}}
    without_venv = replace(settings_with(tmp_path, document), environ={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert load_mcp_config(without_venv).servers["time"].command == str(venv_bin / "mcp-server-time")

    own = tmp_path / "bin"
    own.mkdir()
    (own / "mcp-server-time").write_text("#!/bin/sh\n")
    (own / "mcp-server-time").chmod(0o755)
    on_path = replace(without_venv, environ={"PATH": f"{own}:/usr/bin:/bin"})
    assert load_mcp_config(on_path).servers["time"].command == str(own / "mcp-server-time")  # PATH first

    missing = settings_with(tmp_path, {"mcpServers": {"x": {"command": "no-such-mcp-server-binary"}}})
    with pytest.raises(ConfigurationError) as caught:
        load_mcp_config(missing)
    assert f"nor beside its Python ({venv_bin})" in str(caught.value)

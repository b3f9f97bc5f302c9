"""``starter.py tools``: every tool a worker with this environment would offer, its source, kind and policy default.

Runs the command as a real process (no Temporal server: it needs none) against real MCP servers:
``mcp-server-time`` from PyPI and the project's ``tests.fakes.mcp_orders`` shop, over stdio and
Streamable HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.mcp_servers import free_port, orders_http, url

ROOT = Path(__file__).resolve().parent.parent
TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")
TIMEOUT_S = 60


def time_server() -> dict[str, Any]:
    return {"command": TIME_SERVER, "args": ["--local-timezone", "UTC"]}


def shop_server(ledger: Path, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.fakes.mcp_orders"],
        "cwd": str(ROOT),
        "env": {"ORDERS_LEDGER": str(ledger)},
        **extra,
    }


def tools_command(
    tmp_path: Path,
    *args: str,
    servers: dict[str, Any] | None = None,
    config_text: str | None = None,
    policy: dict[str, Any] | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``starter.py tools ARGS`` with these MCP servers (or this raw config file) and operator policy."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    environ["TEMPORAL_ADDRESS"] = "127.0.0.1:1"  # nothing listens there: the command must not need Temporal
    if servers is not None or config_text is not None:
        config = tmp_path / "mcp.json"
        config.write_text(config_text if config_text is not None else json.dumps({"mcpServers": servers}))
        environ["AGENT_MCP_CONFIG"] = str(config)
    if policy is not None:
        policy_file = tmp_path / "policy.json"
        policy_file.write_text(json.dumps(policy))
        environ["AGENT_POLICY_FILE"] = str(policy_file)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "starter.py", "tools", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def table(stdout: str) -> dict[str, list[str]]:
    """The text table's rows by name: [SOURCE, KIND, POLICY, DESCRIPTION], split at the header's column starts."""
    header, *lines = stdout.splitlines()
    assert header.split() == ["NAME", "SOURCE", "KIND", "POLICY", "DESCRIPTION"], header
    starts = [header.index(column) for column in ("NAME", "SOURCE", "KIND", "POLICY", "DESCRIPTION")]
    rows = {}
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows[cells[0]] = cells[1:]
    return rows


def test_lists_builtins_module_tools_and_mcp_tools_with_source_kind_and_policy_default(tmp_path: Path) -> None:
    done = tools_command(
        tmp_path,
        servers={"time": time_server(), "shop": shop_server(tmp_path / "ledger")},
        AGENT_TOOL_MODULES="tests.fakes.slow_tools",
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    rows = table(done.stdout)
    assert rows["http_request"][:3] == ["builtin", "side effect", "ask (default:side-effect)"]
    assert rows["read_file"][:3] == ["builtin", "sandbox", "allow (default:sandboxed)"]
    assert rows["read_file"][3].startswith("Read a text file")
    assert rows["slow_lookup"][:3] == ["module tests.fakes.slow_tools", "read-only", "allow (default:read-only)"]
    assert rows["mcp__time__get_current_time"][:3] == ["mcp time (stdio)", "read-only", "allow (default:read-only)"]
    assert rows["mcp__shop__lookup_order"][:3] == ["mcp shop (stdio)", "read-only", "allow (default:read-only)"]
    assert rows["mcp__shop__place_order"][:3] == [
        "mcp shop (stdio)",
        "side effect (unknown)",
        "ask (default:side-effect)",
    ]
    assert all(len(row[3]) <= 60 for row in rows.values()), rows
    assert not (tmp_path / "ledger").exists()  # listing calls nothing


def test_json_shows_the_configured_recovery_and_the_operators_rule(tmp_path: Path) -> None:
    shop = shop_server(tmp_path / "ledger", tools={"place_order": {"recovery": "idempotent_by_key"}})
    policy = {"rules": [{"tool": "mcp__shop__*", "decision": "deny", "name": "no-shop"}]}
    done = tools_command(tmp_path, "--json", servers={"shop": shop}, policy=policy)
    assert done.returncode == 0, done.stderr
    tools = {tool["name"]: tool for tool in json.loads(done.stdout)}
    assert all(
        set(t) == {"name", "source", "kind", "side_effect", "recovery", "policy", "rule", "description"}
        for t in tools.values()
    )
    assert tools["mcp__shop__place_order"] == {
        "name": "mcp__shop__place_order",
        "source": "mcp shop (stdio)",
        "kind": "side effect (idempotent_by_key)",
        "side_effect": True,
        "recovery": "idempotent_by_key",
        "policy": "deny",
        "rule": "no-shop",
        "description": "Place an order (a side effect: applied once per idempotency key).",
    }
    assert tools["mcp__shop__lookup_order"]["policy"] == "deny"
    assert tools["mcp__shop__slow_order"]["kind"] == "side effect (unknown)"
    assert (tools["http_request"]["policy"], tools["http_request"]["rule"]) == ("ask", "default:side-effect")
    assert tools["http_request"]["side_effect"] is True


def test_a_server_that_cannot_start_is_reported_and_everything_else_still_listed(tmp_path: Path) -> None:
    broken = {"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]}
    done = tools_command(tmp_path, servers={"broken": broken, "time": time_server()})
    assert done.returncode == 1, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("mcp server broken: unavailable: ")], (
        done.stderr
    )
    rows = table(done.stdout)
    assert rows["mcp__broken__*"][:3] == ["mcp broken (stdio)", "unavailable", "-"]
    assert rows["mcp__time__get_current_time"][1] == "read-only"
    assert rows["http_request"][0] == "builtin"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("bad_json", "AGENT_MCP_CONFIG="),
        ("unknown_field", "mcpServers.time.colour: unknown key 'colour'"),
        ("missing_variable", "${MISSING_VAR}"),
        ("missing_command", "'no-such-mcp-server' is not found"),
        ("bad_policy", "AGENT_POLICY_FILE"),
        ("bad_module", "no_such_tools_module"),
        # refused while the MCP servers start (they start first): still one line, and they are stopped
        ("bad_policy_with_server", "AGENT_POLICY_FILE"),
        ("bad_module_with_server", "no_such_tools_module"),
    ],
)
def test_a_bad_configuration_is_one_line_and_exit_2(tmp_path: Path, case: str, expected: str) -> None:
    kwargs: dict[str, Any] = {}
    if case == "bad_json":
        kwargs["config_text"] = '{"mcpServers": {'
    elif case == "unknown_field":
        kwargs["servers"] = {"time": {**time_server(), "colour": "blue"}}
    elif case == "missing_variable":
        kwargs["servers"] = {"time": {**time_server(), "env": {"TOKEN": "${MISSING_VAR}"}}}
    elif case == "missing_command":
        kwargs["servers"] = {"gone": {"command": "no-such-mcp-server"}}
    elif case.startswith("bad_policy"):
        kwargs["policy"] = {"rules": [{"tool": "*", "decision": "maybe"}]}
    else:
        kwargs["AGENT_TOOL_MODULES"] = "no_such_tools_module"
    if case.endswith("_with_server"):
        kwargs["servers"] = {"time": time_server()}
    done = tools_command(tmp_path, **kwargs)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: ") and expected in done.stderr, done.stderr


def test_secrets_from_the_config_never_appear_even_in_a_servers_descriptions(tmp_path: Path) -> None:
    # The token is also words of place_order's description: what a server says is redacted too.
    token = "applied once per idempotency"
    port = free_port()
    shop = {"url": url(port), "headers": {"Authorization": "Bearer ${SHOP_TOKEN}"}}
    gone = {"url": url(free_port()), "headers": {"X-Key": "${SHOP_TOKEN}"}, "startup_timeout_s": 5}
    with orders_http(port, tmp_path / "ledger"):
        done = tools_command(tmp_path, servers={"shop": shop, "gone": gone}, SHOP_TOKEN=token)
        as_json = tools_command(tmp_path, "--json", servers={"shop": shop}, SHOP_TOKEN=token)
    assert done.returncode == 1, done.stderr  # "gone" listens nowhere
    assert "mcp server gone: unavailable: " in done.stderr
    rows = table(done.stdout)
    assert rows["mcp__shop__place_order"][:2] == ["mcp shop (http)", "side effect (unknown)"]
    assert rows["mcp__shop__place_order"][3] == "Place an order (a side effect: [REDACTED] key)."
    assert as_json.returncode == 0, as_json.stderr
    described = {tool["name"]: tool["description"] for tool in json.loads(as_json.stdout)}
    assert described["mcp__shop__place_order"] == "Place an order (a side effect: [REDACTED] key)."
    for output in (done.stdout, done.stderr, as_json.stdout, as_json.stderr):
        assert token not in output


def test_other_commands_do_not_load_the_mcp_client_or_the_tool_catalog() -> None:
    """``tools`` imports the MCP client library when it runs: the rest of the CLI never pays for it."""
    code = (
        "import sys; import durable_agents.cli.main; "
        "print(sorted(m for m in ('mcp', 'activities.catalog', 'activities.mcp.pool') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout

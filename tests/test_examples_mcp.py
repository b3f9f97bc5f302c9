"""``examples/mcp/``, run for real: ``worker.py`` with ``AGENT_MCP_CONFIG=examples/mcp/mcp.json``.

The config names ``mcp-server-time`` (PyPI) and ``python examples/mcp/notes_server.py``, found on
the worker's ``PATH`` (the venv first, as in a shell with the venv activated). A scripted model
reads the time and the notes (read-only: no approval), adds a note (a side effect: approved with
``starter.py approve``), and the note book shows the note once.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.worker_proc import ROOT, WorkerProc, worker_env
from tests.scenarios import pending_view
from workflows.types import AgentInput, AgentResult

EXAMPLE_CONFIG = ROOT / "examples" / "mcp" / "mcp.json"


def notes_model(body: dict[str, Any]) -> Scripted:
    """Read the time and the notes, then add one note, then answer with what the tools said."""
    results = [m["content"] for m in body.get("messages", []) if m.get("role") == "tool"]
    if not results:
        return Scripted(
            tool_calls=[
                ("mcp__time__get_current_time", json.dumps({"timezone": "UTC"})),
                ("mcp__notes__list_notes", "{}"),
            ]
        )
    if len(results) == 2:
        return Scripted(tool_calls=[("mcp__notes__add_note", json.dumps({"text": "buy milk"}))])
    return Scripted(text=" | ".join(results))


async def test_example_mcp_config_runs_time_and_notes_servers(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    address = dev_env.client.service_client.config.target_host
    task_queue = f"ex-mcp-{uuid.uuid4().hex[:8]}"
    with FakeLLMServer(notes_model) as llm:
        env = worker_env(
            address=address,
            task_queue=task_queue,
            llm_url=llm.openai_url,
            state_dir=tmp_path / "state",
            policy_file=tmp_path / "no-policy.json",
            AGENT_MCP_CONFIG=str(EXAMPLE_CONFIG),
            AGENT_TOOL_MODULES="",
            AGENT_POLICY_FILE="",
            NOTES_FILE=str(notes),
            PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        )
        worker = WorkerProc(env, tmp_path / "worker.log")
        try:
            await worker.async_wait_ready()
            handle = await dev_env.client.start_workflow(
                "AgentWorkflow",
                AgentInput(task="note it", tools=["mcp__time__*", "mcp__notes__*"]),
                id=f"ex-mcp-{uuid.uuid4().hex[:8]}",
                task_queue=task_queue,
                result_type=AgentResult,
            )
            view = await pending_view(handle)
            [approval] = view.pending_approvals
            assert approval.tool == "mcp__notes__add_note" and approval.args == {"text": "buy milk"}
            approve = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "starter.py", "approve", handle.id, approval.approval_id, "--reviewer", "ops"],
                cwd=ROOT,
                env={**env, "TEMPORAL_ADDRESS": address},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert approve.returncode == 0, approve.stderr
            result = await handle.result()
            servers = children_of(worker.pid)
        finally:
            code = worker.stop()
    # Both servers were running under the worker and stop with it.
    assert len(servers) == 2, servers
    assert not [pid for pid in servers if alive(pid)], f"MCP servers outlived the worker: {servers}"
    assert result.status == "completed", f"{result.output}\n{worker.tail()}"
    time_answer, notes_before, added = result.output.split(" | ")
    assert json.loads(time_answer)["timezone"] == "UTC"
    assert notes_before == "(no notes)" and added == "added note 1: buy milk"
    assert json.loads(notes.read_text())["notes"] == ["buy milk"]
    assert code == 0, worker.tail()
    log = (tmp_path / "worker.log").read_text()
    assert '"server": "notes"' in log and "notes server ready" in log  # its stderr, in the worker's log
    assert log.count('"event": "mcp_server_started"') == 2  # one process per server, shared by the run's calls


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie counts as gone: it has exited)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

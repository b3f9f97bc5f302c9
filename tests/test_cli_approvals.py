"""Approvals from the command line, end to end with real processes.

``worker.py`` runs as a subprocess against the dev server and the fake LLM; the
model asks for ``http_request`` POSTs to a real HTTP server on 127.0.0.1 that
records what arrives. Decisions come from ``starter.py`` (the ``decide`` update)
and from the real ``temporal`` CLI (signals).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import queue
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_e2e_cli import Cli
from tests.waiting import eventually_sync
from workflows.types import StatusView

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 20.0
APPROVAL_KEY = "k1"


# --- a destination that records writes -------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Destination:
    """A stdlib HTTP server on 127.0.0.1 answering 200 to everything and recording each request."""

    def __init__(self) -> None:
        self.received: list[Request] = []
        self._lock = threading.Lock()
        dest = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with dest._lock:
                    dest.received.append(
                        Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                payload = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = _record

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def posts(self, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.received if r.method == "POST" and r.path == path]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- a model scripted per task -----------------------------------------------------------


class ScriptByTask:
    """The fake LLM's default reply: each run (told apart by its task) gets its own script."""

    def __init__(self) -> None:
        self._scripts: dict[str, deque[Scripted]] = {}
        self._lock = threading.Lock()

    def add(self, task: str, *replies: Scripted) -> None:
        with self._lock:
            self._scripts[task] = deque(replies)

    def __call__(self, body: dict[str, Any]) -> Scripted:
        task = _task_of(body)
        with self._lock:
            script = self._scripts.get(task)
            return script.popleft() if script else Scripted(text="done")


def _task_of(body: dict[str, Any]) -> str:
    return next((str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"), "")


@dataclass
class Setup:
    cli: Cli
    llm: FakeLLMServer
    script: ScriptByTask
    dest: Destination
    log: Path

    def requests_for(self, task: str) -> list[dict[str, Any]]:
        return [r["body"] for r in list(self.llm.requests) if _task_of(r["body"]) == task]


def _start_worker(
    dev_env: WorkflowEnvironment, llm: FakeLLMServer, state: Path, extra: dict[str, str]
) -> tuple[subprocess.Popen[bytes], Cli, Path]:
    address = dev_env.client.service_client.config.target_host
    env = {
        "PATH": os.environ["PATH"],
        "TEMPORAL_ADDRESS": address,
        "AGENT_TASK_QUEUE": f"approvals-{uuid.uuid4().hex[:8]}",
        "AGENT_MODEL": "openai:test-model",
        "OPENAI_BASE_URL": llm.openai_url,
        "OPENAI_API_KEY": "sk-test",
        "AGENT_STATE_DIR": str(state),
        "AGENT_HTTP_ALLOW": "127.0.0.1:1024-65535",
        "AGENT_LOG_LEVEL": "DEBUG",
        **extra,
    }
    state.mkdir(parents=True)
    log = state / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "worker.py")], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    # The starter gets the worker's address and queue, never its approval key.
    cli_env = {k: v for k, v in env.items() if k != "AGENT_APPROVAL_KEY"}
    return worker, Cli(cli_env, address), log


def _stop(worker: subprocess.Popen[bytes], log: Path) -> None:
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, log.read_text()[-2000:]


@pytest.fixture(scope="module")
def shared(dev_env: WorkflowEnvironment) -> Iterator[tuple[FakeLLMServer, ScriptByTask, Destination]]:
    script = ScriptByTask()
    dest = Destination()
    with FakeLLMServer(default=script) as llm:
        yield llm, script, dest
    dest.close()


def _setup_fixture(extra: dict[str, str]) -> Callable[..., Iterator[Setup]]:
    def fixture(
        dev_env: WorkflowEnvironment,
        shared: tuple[FakeLLMServer, ScriptByTask, Destination],
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[Setup]:
        llm, script, dest = shared
        worker, cli, log = _start_worker(dev_env, llm, tmp_path_factory.mktemp("worker") / "state", extra)
        try:
            yield Setup(cli, llm, script, dest, log)
        finally:
            _stop(worker, log)

    return fixture


unsigned = pytest.fixture(scope="module", name="unsigned")(_setup_fixture({}))
signed = pytest.fixture(scope="module", name="signed")(_setup_fixture({"AGENT_APPROVAL_KEY": APPROVAL_KEY}))


# --- helpers --------------------------------------------------------------------------------


def _post(setup: Setup, path: str, body: Any = None) -> tuple[str, str]:
    args: dict[str, Any] = {"method": "POST", "url": setup.dest.url + path}
    if body is not None:
        args["json"] = body
    return ("http_request", json.dumps(args))


def _new_run(setup: Setup, *replies: Scripted) -> tuple[str, str]:
    workflow_id = f"cli-approvals-{uuid.uuid4().hex[:10]}"
    task = f"do the thing for {workflow_id}"
    setup.script.add(task, *replies)
    return workflow_id, task


def _start(setup: Setup, workflow_id: str, task: str, *options: str) -> None:
    started = setup.cli.starter("run", task, "--id", workflow_id, *options)
    assert started.returncode == 0, started.stderr


# The Temporal CLI prints an empty list or dict as null; starter.py shows the view's [] or {}.
_EMPTY = {name: field.default_factory for name, field in StatusView.model_fields.items() if field.default_factory}


def _queried(setup: Setup, workflow_id: str) -> dict[str, Any] | None:
    """The run's own status query through the Temporal CLI (a cheap process to poll with), or None.

    Shaped as ``starter.py status --json`` shows a running run: the workflow id, then the view.
    """
    asked = setup.cli.temporal("workflow", "query", "--workflow-id", workflow_id, "--name", "status", "-o", "json")
    if asked.returncode != 0:
        return None
    answer = json.loads(asked.stdout)
    view = answer.get("queryResult", [answer])[0] if isinstance(answer, dict) else answer[0]
    if not isinstance(view, dict):
        return None
    shown = {k: (_EMPTY[k]() if v is None and k in _EMPTY else v) for k, v in view.items()}  # type: ignore[call-arg]
    return {"workflow_id": workflow_id, **shown}


def _waiting_count(setup: Setup, workflow_id: str) -> int:
    """How many decisions the run's own status query lists."""
    view = _queried(setup, workflow_id)
    return len(view.get("pending_approvals") or []) if view is not None else 0


def _pending(setup: Setup, workflow_id: str, count: int = 1) -> list[dict[str, Any]]:
    """``starter.py pending RUN_ID --json`` once the run waits for ``count`` decisions."""

    def waiting() -> int:
        found = _waiting_count(setup, workflow_id)
        assert found >= count, setup.log.read_text()[-2000:]
        return found

    eventually_sync(waiting, f"{workflow_id} waits for {count} decision(s)", every_s=0.2)

    def listed() -> list[dict[str, Any]]:
        shown = setup.cli.starter("pending", workflow_id, "--json")
        rows: list[dict[str, Any]] = json.loads(shown.stdout) if shown.returncode == 0 else []
        assert len(rows) >= count, f"{shown.stderr}\n{setup.log.read_text()[-2000:]}"
        return rows

    return eventually_sync(listed, f"{workflow_id} lists {count} approval(s)", every_s=0.2)


def _status(setup: Setup, workflow_id: str) -> dict[str, Any]:
    shown = setup.cli.starter("status", workflow_id, "--json")
    assert shown.returncode == 0, shown.stderr
    data: dict[str, Any] = json.loads(shown.stdout)
    return data


def _wait_status(setup: Setup, workflow_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``starter.py status RUN_ID --json`` once ``done`` holds for it.

    ``starter.py`` is a ~1 s process start, which a poll every 0.2 s would pay for tens of times: the
    wait polls the run's status query with the Temporal CLI and asks ``starter.py`` once that view
    satisfies ``done`` (or cannot tell: a field only a closed run's result has), and every tenth poll
    regardless, in case the two show a field differently.
    """
    polls = 0

    def reached() -> dict[str, Any]:
        nonlocal polls
        polls += 1
        view = _queried(setup, workflow_id)
        if polls % 10 and view is not None:
            # A field the query lacks (KeyError, ...): starter.py decides.
            with contextlib.suppress(KeyError, TypeError, IndexError):
                assert done(view), f"{view}\n{setup.log.read_text()[-2000:]}"
        data = _status(setup, workflow_id)
        assert done(data), f"{data}\n{setup.log.read_text()[-2000:]}"
        return data

    return eventually_sync(reached, f"{workflow_id} reaches the awaited status", every_s=0.2)


def _completed(setup: Setup, workflow_id: str) -> dict[str, Any]:
    return _wait_status(setup, workflow_id, lambda d: d["state"] not in ("running", "waiting_approval"))


def _side_by_side(setup: Setup, *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Run independent starter commands concurrently (each is a ~1 s process start)."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(lambda argv: setup.cli.starter(*argv), commands))


def _one_line_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], result.stderr


# --- tests ----------------------------------------------------------------------------------


def test_signal_approval_from_temporal_cli_runs_the_post_once(unsigned: Setup) -> None:
    path = f"/orders/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(
        unsigned, Scripted(tool_calls=[_post(unsigned, path, {"sku": "A1", "qty": 2})]), Scripted(text="order placed")
    )
    _start(unsigned, workflow_id, task)

    [row] = _pending(unsigned, workflow_id)
    assert row["workflow_id"] == workflow_id and row["tool"] == "http_request"
    assert row["args"]["method"] == "POST" and row["args"]["url"] == unsigned.dest.url + path
    assert row["args"]["json"] == {"sku": "A1", "qty": 2}
    assert row["reviewers"] == [] and row["time_left"].startswith("23h59m")  # default expiry: 24 h
    assert unsigned.dest.posts(path) == []

    everything = unsigned.cli.starter("pending")  # every running run that waits
    assert everything.returncode == 0, everything.stderr
    shown = everything.stdout.splitlines()
    [at] = [i for i, ln in enumerate(shown) if workflow_id in ln]
    assert row["approval_id"] in shown[at] and "by=anyone" in shown[at]
    assert shown[at + 1] == f"    http_request POST {unsigned.dest.url}{path}"  # the call, then its body's digest
    assert shown[at + 2].startswith("      json body (canonical JSON): 20 bytes, sha256 ")

    signal_input = json.dumps({"approval_id": row["approval_id"], "reviewer": "alice"})
    sent = unsigned.cli.temporal(
        "workflow", "signal", "--workflow-id", workflow_id, "--name", "approve", "--input", signal_input
    )
    assert sent.returncode == 0, sent.stderr

    final = _completed(unsigned, workflow_id)
    assert final["state"] == "completed" and final["output"] == "order placed"
    [post] = unsigned.dest.posts(path)
    assert post.headers["idempotency-key"].startswith("ik_")
    assert json.loads(post.body) == {"sku": "A1", "qty": 2}


def test_reject_without_approval_id_tells_the_model(unsigned: Setup) -> None:
    path = f"/orders/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(unsigned, Scripted(tool_calls=[_post(unsigned, path)]), Scripted(text="gave up"))
    _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, workflow_id)

    rejected = unsigned.cli.starter("reject", workflow_id, "--reviewer", "bob", "--reason", "too risky")
    assert rejected.returncode == 0, rejected.stderr
    *deciding, verdict = rejected.stdout.strip().splitlines()
    assert deciding[0].startswith(f"reject {row['approval_id']} of run {workflow_id}, step 1")
    assert deciding[1] == f"    http_request POST {unsigned.dest.url}{path}"
    assert verdict == f"rejected {row['approval_id']} (http_request POST {unsigned.dest.url}{path}) as bob: too risky"

    assert _completed(unsigned, workflow_id)["state"] == "completed"
    assert unsigned.dest.posts(path) == []
    second = unsigned.requests_for(task)[1]
    tool_messages = [m["content"] for m in second["messages"] if m["role"] == "tool"]
    assert any("rejected by bob" in text and "too risky" in text for text in tool_messages), tool_messages


def test_refused_decisions_through_the_update(unsigned: Setup) -> None:
    path_a, path_b = f"/a/{uuid.uuid4().hex[:8]}", f"/b/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(
        unsigned,
        Scripted(tool_calls=[_post(unsigned, path_a), _post(unsigned, path_b)]),
        Scripted(text="finished"),
    )
    _start(unsigned, workflow_id, task, "--approver", "alice")
    rows = _pending(unsigned, workflow_id, count=2)
    by_path = {r["args"]["url"].removeprefix(unsigned.dest.url): r["approval_id"] for r in rows}
    first, second = by_path[path_a], by_path[path_b]
    assert all(r["reviewers"] == ["alice"] for r in rows)

    # Read-only or refused: none of these changes the run, so they run side by side.
    which, status_text, mallory, forged = _side_by_side(
        unsigned,
        ("approve", workflow_id, "--reviewer", "alice"),
        ("status", workflow_id),
        ("approve", workflow_id, first, "--reviewer", "mallory"),
        ("approve", workflow_id, "ap_0123456789abcdef", "--reviewer", "alice"),
    )
    _one_line_error(which, 1, "2 pending approvals", first, second)

    assert status_text.returncode == 0, status_text.stderr
    assert "pending_approvals: 2" in status_text.stdout and f"{first}  rule=" in status_text.stdout
    assert f"http_request POST {unsigned.dest.url}{path_a}\n" in status_text.stdout
    assert "by=alice" in status_text.stdout and "left=23h59m" in status_text.stdout

    _one_line_error(mallory, 1, "error: refused:", "not an approver")
    _one_line_error(forged, 1, "error: refused:", "no pending approval ap_0123456789abcdef")
    assert unsigned.dest.posts(path_a) == [] and unsigned.dest.posts(path_b) == []

    approved = unsigned.cli.starter("approve", workflow_id, first, "--reviewer", "alice", "--comment", "ok")
    assert approved.returncode == 0, approved.stderr
    assert (
        approved.stdout.splitlines()[-1]
        == f"approved {first} (http_request POST {unsigned.dest.url}{path_a}) as alice: ok"
    )
    again = unsigned.cli.starter("approve", workflow_id, first, "--reviewer", "alice")  # the run still waits for b
    _one_line_error(again, 1, "error: refused:", "already decided")

    rejected = unsigned.cli.starter("reject", workflow_id, "--reviewer", "alice", "--reason", "one is enough")
    assert rejected.returncode == 0 and rejected.stdout.splitlines()[-1].startswith(f"rejected {second} ")
    assert _completed(unsigned, workflow_id)["state"] == "completed"
    assert len(unsigned.dest.posts(path_a)) == 1 and unsigned.dest.posts(path_b) == []

    done = unsigned.cli.starter("approve", workflow_id, "--reviewer", "alice")
    _one_line_error(done, 1, f"run {workflow_id} is not running (completed)")


def test_signed_decisions(signed: Setup) -> None:
    path = f"/signed/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(signed, Scripted(tool_calls=[_post(signed, path)]), Scripted(text="signed off"))
    _start(signed, workflow_id, task)
    [row] = _pending(signed, workflow_id)
    approval_id = row["approval_id"]

    # An unsigned signal (the Temporal CLI cannot sign) is refused and recorded; the run keeps waiting.
    signal_input = json.dumps({"approval_id": approval_id, "reviewer": "alice"})
    sent = signed.cli.temporal(
        "workflow", "signal", "--workflow-id", workflow_id, "--name", "approve", "--input", signal_input
    )
    assert sent.returncode == 0, sent.stderr
    status = _wait_status(signed, workflow_id, lambda d: bool(d.get("refused")))
    assert status["state"] == "waiting_approval"
    assert [p["approval_id"] for p in status["pending_approvals"]] == [approval_id]
    assert "via signal" in status["refused"][-1] and "signed" in status["refused"][-1]

    unsigned_update = signed.cli.starter("approve", workflow_id, "--reviewer", "alice")
    _one_line_error(unsigned_update, 1, "error: refused:", "requires signed")
    wrong_key = {**signed.cli.env, "AGENT_APPROVAL_KEY": "wrong"}
    forged = signed.cli.starter("approve", workflow_id, "--reviewer", "alice", env=wrong_key)
    _one_line_error(forged, 1, "error: refused:", "signature")
    assert signed.dest.posts(path) == []

    right_key = {**signed.cli.env, "AGENT_APPROVAL_KEY": APPROVAL_KEY}
    approved = signed.cli.starter("approve", workflow_id, "--reviewer", "alice", env=right_key)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.splitlines()[-1].startswith(f"approved {approval_id} ")
    assert _completed(signed, workflow_id)["state"] == "completed"
    assert len(signed.dest.posts(path)) == 1


def _read_lines(stream: Any, into: queue.Queue[str | None]) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def test_follow_without_a_terminal_prints_the_commands(unsigned: Setup) -> None:
    path = f"/follow/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(unsigned, Scripted(tool_calls=[_post(unsigned, path)]), Scripted(text="followed"))
    follow = subprocess.Popen(
        [sys.executable, str(ROOT / "starter.py"), "run", task, "--id", workflow_id, "--follow", "--reviewer", "tess"],
        env=unsigned.cli.env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(follow.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not any("temporal workflow signal" in line for line in seen):
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "".join(seen)
            seen.append(line)
        approval_id = _pending(unsigned, workflow_id)[0]["approval_id"]
        starter_command = f"python starter.py approve {workflow_id} {approval_id} --reviewer tess"
        signal_command = (
            f"temporal workflow signal --workflow-id {workflow_id} --name approve "
            f'--input \'{{"approval_id": "{approval_id}", "reviewer": "tess"}}\''
        )
        assert any(line.strip().endswith(starter_command) for line in seen), "".join(seen)
        assert any(line.strip().endswith(signal_command) for line in seen), "".join(seen)

        # The printed command works as printed.
        argv = shlex.split(starter_command)
        approved = unsigned.cli.starter(*argv[2:])
        assert approved.returncode == 0, approved.stderr
        assert follow.wait(timeout=DEADLINE_S) == 0, follow.stderr.read() if follow.stderr else ""
    finally:
        if follow.poll() is None:
            follow.kill()
    while (line := lines.get(timeout=5)) is not None:
        seen.append(line)
    output = "".join(seen)
    assert output.count("approval needed:") == 1, output
    assert "status: completed" in output and "followed" in output
    assert len(unsigned.dest.posts(path)) == 1


def test_follow_on_a_terminal_asks(unsigned: Setup) -> None:
    path = f"/tty/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(unsigned, Scripted(tool_calls=[_post(unsigned, path)]), Scripted(text="asked"))
    controller, terminal = pty.openpty()
    follow = subprocess.Popen(
        [sys.executable, str(ROOT / "starter.py"), "run", task, "--id", workflow_id, "--follow", "--reviewer", "tina"],
        env=unsigned.cli.env,
        cwd=ROOT,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    screen = b""

    def expect(text: bytes) -> None:
        nonlocal screen

        def shown() -> bool:
            nonlocal screen
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    screen += os.read(controller, 4096)
                except OSError:  # the process ended and closed the terminal: no more will come
                    if text not in screen:
                        raise RuntimeError(f"the terminal closed before {text!r}: {screen!r}") from None
            assert text in screen, screen.decode(errors="replace")
            return True

        eventually_sync(shown, f"the terminal shows {text!r}", every_s=0)

    try:
        expect(b"approve? [y/n/c=comment] ")
        assert b"http_request POST http://127.0.0.1:" in screen and b"rule: default:side-effect" in screen
        os.write(controller, b"c\n")
        expect(b"comment: ")
        os.write(controller, b"looks right\n")
        expect(b"as tina: looks right")
        expect(b"status: completed")
        assert follow.wait(timeout=DEADLINE_S) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
        os.close(controller)
    assert len(unsigned.dest.posts(path)) == 1


def test_run_policy_file_tightens_and_bad_files_are_usage_errors(unsigned: Setup, tmp_path: Path) -> None:
    strict = tmp_path / "strict.json"
    strict.write_text(json.dumps({"rules": [{"name": "reads-too", "tool": "http_request", "decision": "ask"}]}))
    path = f"/read/{uuid.uuid4().hex[:8]}"
    read = ("http_request", json.dumps({"method": "GET", "url": unsigned.dest.url + path}))
    workflow_id, task = _new_run(unsigned, Scripted(tool_calls=[read]), Scripted(text="read"))
    _start(unsigned, workflow_id, task, "--policy", str(strict))
    [row] = _pending(unsigned, workflow_id)  # a GET is allowed by default; this run's policy asks
    assert row["rule"] == "reads-too" and row["args"]["method"] == "GET"
    cancelled = unsigned.cli.starter("cancel", workflow_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert _completed(unsigned, workflow_id)["state"] == "cancelled"
    assert unsigned.dest.posts(path) == [] and not [r for r in unsigned.dest.received if r.path == path]

    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    loose = tmp_path / "loose.json"
    loose.write_text(json.dumps({"rules": [{"tool": "http_request", "decision": "maybe"}]}))
    bad, invalid, missing = _side_by_side(
        unsigned,
        ("run", "x", "--policy", str(broken)),
        ("run", "x", "--policy", str(loose)),
        ("run", "x", "--policy", str(tmp_path / "nope.json")),
    )
    _one_line_error(bad, 2, "--policy", "not valid JSON")
    _one_line_error(invalid, 2, "--policy", "rules.0.decision")
    _one_line_error(missing, 2, "--policy", "No such file")

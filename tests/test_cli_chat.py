"""``starter.py chat``: a conversation in a real pseudo-terminal, end to end with real processes.

``worker.py`` runs as a subprocess against the dev server and the fake LLM server; the
model's tool call is an ``http_request`` POST to a real HTTP server on 127.0.0.1, which the
default policy puts to ``ask``, so the chat asks for it inline. The terminal is a pty
(``pty.fork``): the chat reads what is typed there and Ctrl-C is the byte the terminal
turns into SIGINT.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.interrupts import as_from_a_terminal
from tests.test_e2e_cli import Cli
from tests.waiting import DEADLINE_S, eventually_sync

ROOT = Path(__file__).resolve().parent.parent


class HeldReply:
    """The fake model's answer when nothing is scripted; while ``held``, it comes once ``release`` is set."""

    def __init__(self) -> None:
        self.held = False
        self.release = threading.Event()
        self.text = "(unscripted)"

    def __call__(self, body: dict[str, Any]) -> Scripted:
        if self.held:
            self.release.wait(DEADLINE_S)
        return Scripted(text=self.text)


@dataclass
class Setup:
    cli: Cli
    llm: FakeLLMServer
    sink: HttpSink
    log: Path
    held: HeldReply

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in list(self.llm.requests) if r["path"].endswith("/chat/completions")]


@pytest.fixture(scope="module")
def setup(dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    state = tmp_path_factory.mktemp("chat") / "state"
    state.mkdir()
    held = HeldReply()
    with FakeLLMServer(default=held) as llm, HttpSink() as sink:
        address = dev_env.client.service_client.config.target_host
        env = {
            "PATH": os.environ["PATH"],
            "TEMPORAL_ADDRESS": address,
            "AGENT_TASK_QUEUE": f"chat-{uuid.uuid4().hex[:8]}",
            "AGENT_MODEL": "openai:test-model",
            "OPENAI_BASE_URL": llm.openai_url,
            "OPENAI_API_KEY": "sk-test",
            "AGENT_STATE_DIR": str(state),
            "AGENT_HTTP_ALLOW": "127.0.0.1:1024-65535",
        }
        log = state / "worker.log"
        with open(log, "w") as out:
            worker = subprocess.Popen(
                [sys.executable, str(ROOT / "worker.py")], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            yield Setup(Cli(env, address), llm, sink, log, held)
            held.release.set()
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=30) == 0, log.read_text()[-2000:]


class Terminal:
    """``starter.py ARGS`` on a pseudo-terminal of its own: type into it, wait for what it shows."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        argv = [sys.executable, str(ROOT / "starter.py"), *args]
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal, so Ctrl-C there is its SIGINT
            os.chdir(ROOT)
            as_from_a_terminal()
            os.execve(sys.executable, argv, env)
        self.pid, self.fd = pid, fd
        self.screen = b""
        self.seen = 0  # what expect() has matched so far: each expect looks after it
        self.closed = False
        self.reaped = False

    def _read(self, wait_s: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], wait_s)
        if not ready:
            return
        try:
            chunk = os.read(self.fd, 4096)
        except OSError:  # the process ended and closed the terminal
            chunk = b""
        if not chunk:
            self.closed = True
        self.screen += chunk

    def expect(self, text: str) -> str:
        """Wait until ``text`` is shown after the last match; what was shown up to its end."""
        wanted = text.encode()

        def shown() -> int:
            if not self.closed:
                self._read(0.2)
            at = self.screen.find(wanted, self.seen)
            if at < 0 and self.closed:
                raise RuntimeError(f"the terminal closed before {text!r}:\n{self.text}")
            assert at >= 0, self.text[-3000:]
            return at + len(wanted)

        end = eventually_sync(shown, f"the terminal shows {text!r}", every_s=0)
        before, self.seen = self.screen[self.seen : end].decode(errors="replace"), end
        return before

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def wait(self) -> int:
        """Read until the terminal closes; the exit code (128 + N for signal N)."""

        def ended() -> bool:
            self._read(0.2)
            return self.closed

        eventually_sync(ended, "the chat ends", every_s=0)
        _, status = os.waitpid(self.pid, 0)
        self.reaped = True
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)

    def kill(self) -> None:
        """End the chat if a test failed before it did (its pid is never signalled once reaped)."""
        if self.reaped:
            return
        self.reaped = True
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)

    @property
    def text(self) -> str:
        return self.screen.decode(errors="replace").replace("\r\n", "\n")


def _status(setup: Setup, session_id: str) -> dict[str, Any]:
    shown = setup.cli.starter("status", session_id, "--json")
    assert shown.returncode == 0, shown.stderr
    data: dict[str, Any] = json.loads(shown.stdout)
    return data


def _roles(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], str(m.get("content") or "")) for m in body["messages"][1:]]


def test_chat_two_messages_an_inline_approval_then_ctrl_c(setup: Setup) -> None:
    path = f"/chat/{uuid.uuid4().hex[:8]}"
    post = json.dumps({"method": "POST", "url": setup.sink.url + path, "json": {"note": "from chat"}})
    setup.llm.enqueue(
        Scripted(text="hello, human"), Scripted(tool_calls=[("http_request", post)]), Scripted(text="posted it")
    )
    before = len(setup.chat_bodies())
    term = Terminal(setup.cli.env, "chat", "--reviewer", "rita")
    try:
        header = term.expect("you> ")
        found = re.search(r"new session (chat-[0-9a-f]{8})", header)
        assert found, term.text
        session_id = found.group(1)

        term.type(b"hi there\n")
        term.expect("agent> hello, human")
        term.expect("you> ")

        term.type(b"please post the note\n")
        asked = term.expect("approve? [y/n] ")
        assert f"http_request POST {setup.sink.url}{path}" in asked, term.text
        assert "rule default:side-effect" in asked, term.text
        assert [r for r in setup.sink.received if r.path == path] == []  # nothing was sent before the answer
        term.type(b"maybe\n")  # neither y nor n: asked again
        term.expect("approve? [y/n] ")
        term.type(b"y\n")
        decided = term.expect("agent> posted it")
        assert "approved " in decided and " as rita" in decided, term.text
        assert "tool_finished" in decided, term.text  # the progress of the call was shown as it happened
        term.expect("you> ")

        term.type(b"\x03")  # Ctrl-C
        code = term.wait()
    finally:
        term.kill()
    output = term.text
    assert code == 130, output
    assert "Traceback" not in output, output
    assert f"chat {session_id}" in output and f"send {session_id} " in output, output
    assert f"\ninterrupted: session {session_id} goes on; resume with: " in output, output

    # The POST went out once, its result reached the model, and each turn saw the whole conversation.
    posts = [r for r in setup.sink.received if r.path == path]
    assert len(posts) == 1 and json.loads(posts[0].body) == {"note": "from chat"}
    bodies = setup.chat_bodies()[before:]
    assert len(bodies) == 3
    assert _roles(bodies[1]) == [("user", "hi there"), ("assistant", "hello, human"), ("user", "please post the note")]
    tool_results = [m for m in bodies[2]["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 1 and '"ok": true' in tool_results[0]["content"], tool_results

    # Leaving the chat left the session running, idle, waiting for the next message.
    status = _status(setup, session_id)
    assert status["state"] == "idle" and status["messages"] == 2 and status["replied"] == 2, status
    assert status["output"] == "posted it"


def _chat_piped(setup: Setup, *args: str, lines: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), "chat", *args],
        env=setup.cli.env,
        cwd=ROOT,
        input=lines,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def test_end_of_input_leaves_and_chat_wakes_an_ended_session(setup: Setup) -> None:
    session_id = f"chat-wake-{uuid.uuid4().hex[:6]}"
    setup.llm.enqueue(Scripted(text="first answer"), Scripted(text="second answer"))
    before = len(setup.chat_bodies())

    first = _chat_piped(setup, session_id, "--reviewer", "otto", lines="remember 42\n")
    assert first.returncode == 0, first.stderr
    assert "no session yet with this id" in first.stdout, first.stdout
    assert "you> remember 42\n" in first.stdout and "agent> first answer" in first.stdout, first.stdout
    assert "resume with: " in first.stdout and f"starter.py chat {session_id}" in first.stdout, first.stdout
    assert first.stderr == "", first.stderr

    # Joining a running session says where it stands; end of input at once leaves it as it was.
    joined = _chat_piped(setup, session_id, lines="")
    assert joined.returncode == 0, joined.stderr
    assert f"joined session {session_id}: 1 message(s), idle" in joined.stdout, joined.stdout
    assert "last reply: first answer" in joined.stdout, joined.stdout

    closed = setup.cli.temporal("workflow", "signal", "--workflow-id", session_id, "--name", "close")
    assert closed.returncode == 0, closed.stderr
    ended = setup.cli.temporal("workflow", "result", "--workflow-id", session_id)
    assert ended.returncode == 0, ended.stderr

    again = _chat_piped(setup, session_id, lines="what was it?\n")
    assert again.returncode == 0, again.stderr
    assert "has ended (completed); your next message wakes it" in again.stdout, again.stdout
    assert "agent> second answer" in again.stdout, again.stdout
    bodies = setup.chat_bodies()[before:]
    assert _roles(bodies[-1]) == [("user", "remember 42"), ("assistant", "first answer"), ("user", "what was it?")]
    status = _status(setup, session_id)
    assert status["state"] == "idle" and status["messages"] == 2, status


def test_chat_refuses_what_is_not_a_session(setup: Setup) -> None:
    setup.llm.enqueue(Scripted(text="plain run done"))
    run_id = f"plain-{uuid.uuid4().hex[:6]}"
    ran = setup.cli.starter("run", "a one-shot task", "--id", run_id, "--wait")
    assert ran.returncode == 0, ran.stderr
    refused = _chat_piped(setup, run_id, lines="hello\n")
    assert refused.returncode == 1
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: run {run_id} was not a session; start one with "), line
    assert line.endswith("starter.py chat (no id)"), line
    assert "Traceback" not in refused.stdout + refused.stderr

    bad = _chat_piped(setup, "--max-steps", "0", lines="")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--max-steps" in bad.stderr

    too_long = _chat_piped(setup, lines="x" * 100_001 + "\n")
    assert too_long.returncode == 0, too_long.stderr
    assert "refused: the message: String should have at most 100000 characters" in too_long.stdout, too_long.stdout
    [session_id] = re.findall(r"new session (chat-[0-9a-f]{8})", too_long.stdout)
    assert f"no message was taken: session {session_id} was not started" in too_long.stdout, too_long.stdout
    assert setup.cli.starter("status", session_id).returncode == 1  # nothing was started under that id


def test_a_refused_message_is_one_line_and_the_prompt_returns(setup: Setup) -> None:
    run_id = f"chat-taken-{uuid.uuid4().hex[:6]}"
    term = Terminal(setup.cli.env, "chat", run_id)
    try:
        term.expect("you> ")
        # Meanwhile a plain run (not a session) starts under that id and waits for an approval.
        path = f"/taken/{uuid.uuid4().hex[:8]}"
        post = json.dumps({"method": "POST", "url": setup.sink.url + path})
        setup.llm.enqueue(Scripted(tool_calls=[("http_request", post)]))
        started = setup.cli.starter("run", "a plain run", "--id", run_id)
        assert started.returncode == 0, started.stderr
        eventually_sync(
            lambda: _status(setup, run_id)["state"] == "waiting_approval", f"{run_id} waits for its approval"
        )
        term.type(b"hello?\n")
        refused = term.expect("you> ")
        assert refused.replace("\r\n", "\n").splitlines() == [
            "hello?",  # the terminal's echo
            'refused: not_a_session: this run is not a session (a session starts with "session": {} in its input)',
            "you> ",
        ], refused
        assert "agent>" not in refused
        term.type(b"\x04")  # Ctrl-D at the prompt
        code = term.wait()
    finally:
        term.kill()
    output = term.text
    assert code == 0, output
    assert "Traceback" not in output and f"session {run_id} was not started by this chat" in output, output
    cancelled = setup.cli.starter("cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert [r for r in setup.sink.received if r.path == path] == []


def test_n_rejects_the_call_and_the_model_is_told(setup: Setup) -> None:
    path = f"/reject/{uuid.uuid4().hex[:8]}"
    post = json.dumps({"method": "POST", "url": setup.sink.url + path})
    setup.llm.enqueue(Scripted(tool_calls=[("http_request", post)]), Scripted(text="fine, I did not post"))
    before = len(setup.chat_bodies())
    chat = _chat_piped(setup, "--reviewer", "nina", lines="post it\nn\n")
    assert chat.returncode == 0, chat.stderr
    assert "approve? [y/n] n\n" in chat.stdout and " as nina: rejected in chat by nina" in chat.stdout, chat.stdout
    assert "agent> fine, I did not post" in chat.stdout, chat.stdout
    assert [r for r in setup.sink.received if r.path == path] == []
    [tool_result] = [m for m in setup.chat_bodies()[before:][-1]["messages"] if m["role"] == "tool"]
    assert "rejected in chat by nina" in tool_result["content"], tool_result


def test_a_question_the_model_asks_is_answered_in_the_chat(setup: Setup) -> None:
    ask = json.dumps({"question": "Which drink?", "options": ["tea", "coffee"], "allow_free_text": False})
    setup.llm.enqueue(Scripted(tool_calls=[("ask_human", ask)]), Scripted(text="coffee it is"))
    before = len(setup.chat_bodies())
    chat = _chat_piped(setup, "--reviewer", "nina", lines="what should I drink?\nwater\n2\n")
    assert chat.returncode == 0, chat.stderr
    assert "    asks: Which drink?\n    options: 1) tea  2) coffee  (only these" in chat.stdout, chat.stdout
    assert chat.stdout.count("answer (1-2): ") == 2, chat.stdout  # "water" is not an option: asked again
    assert "(Which drink?) as nina: coffee" in chat.stdout and "agent> coffee it is" in chat.stdout, chat.stdout
    [tool_result] = [m for m in setup.chat_bodies()[before:][-1]["messages"] if m["role"] == "tool"]
    assert tool_result["content"] == "coffee", tool_result


def test_ctrl_c_mid_turn_and_joining_a_session_at_work(setup: Setup) -> None:
    setup.held.held, setup.held.text = True, "worth the wait"
    setup.held.release.clear()
    requests = len(setup.llm.requests)
    term = Terminal(setup.cli.env, "chat")
    joiner: Terminal | None = None
    try:
        found = re.search(r"new session (chat-[0-9a-f]{8})", term.expect("you> "))
        assert found, term.text
        session_id = found.group(1)
        term.type(b"take your time\n")
        eventually_sync(lambda: len(setup.llm.requests) > requests, "the model is asked")
        term.type(b"\x03")  # Ctrl-C while the model works on the answer
        assert term.wait() == 130, term.text
        assert "agent>" not in term.text and f"interrupted: session {session_id} goes on" in term.text, term.text

        # Another chat joins while the agent still works: it shows the reply once it comes.
        joiner = Terminal(setup.cli.env, "chat", session_id)
        joiner.expect(f"joined session {session_id}: 1 message(s), running")
        setup.held.release.set()
        joiner.expect("agent> worth the wait")
        joiner.expect("you> ")
        joiner.type(b"\x04")
        assert joiner.wait() == 0, joiner.text
    finally:
        setup.held.held = False
        setup.held.release.set()
        term.kill()
        if joiner is not None:
            joiner.kill()
    assert "Traceback" not in term.text + joiner.text
    status = _status(setup, session_id)
    assert status["state"] == "idle" and status["replied"] == 1 and status["output"] == "worth the wait", status


def test_chat_and_run_follow_print_the_models_text_as_it_streams(setup: Setup) -> None:
    """The first piece of a reply is on the terminal while the model is still answering (the fake server holds
    the rest), on the reply's own line; the finished reply is not printed a second time. (The worker holds back
    the last characters it has, as many as twice its longest secret, until more come: a first piece of 40.)"""
    reply = "streamed reply, piece by piece, each as it comes from the model"
    gate = threading.Event()
    setup.llm.enqueue(Scripted(text=reply, chunk_chars=40, hold=gate))
    before = len(setup.chat_bodies())
    term = Terminal(setup.cli.env, "chat", "--reviewer", "sam")
    try:
        term.expect("you> ")
        term.type(b"stream to me\n")
        term.expect("agent> streamed reply")  # the first piece, while the model call is open
        assert not gate.is_set()
        assert setup.chat_bodies()[before].get("stream") is True  # someone listened: the turn streamed
        gate.set()
        shown = term.expect("you> ")
        assert "each as it comes from the model" in shown, term.text
        term.type(b"\x04")  # Ctrl-D leaves
        term.wait()
    finally:
        gate.set()
        term.kill()
    assert term.text.count(reply) == 1, term.text

    gate = threading.Event()
    answer = "a followed run's answer, streamed to the terminal that started it"
    setup.llm.enqueue(Scripted(text=answer, chunk_chars=40, hold=gate))
    before = len(setup.chat_bodies())
    term = Terminal(setup.cli.env, "run", "answer me", "--follow")
    try:
        term.expect("  a followed run")  # the first piece, indented under the run's progress lines
        assert not gate.is_set()
        assert setup.chat_bodies()[before].get("stream") is True
        gate.set()
        code = term.wait()
    finally:
        gate.set()
        term.kill()
    assert code == 0, term.text
    lines = term.text.replace("\r\n", "\n").splitlines()
    assert f"  {answer}" in lines, term.text  # the streamed line, whole once the turn ended
    assert "Traceback" not in term.text, term.text

"""The built-in sandbox tools: run_python, run_shell, write_file, read_file (``http_request`` is in ``http``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field

from activities.sandbox.base import Sandbox, SandboxError
from activities.tools.spec import ToolContext, ToolError, tool

# The sandbox's own wall-time cap (AGENT_SANDBOX_TIMEOUT_S) usually binds first; this keeps a
# command inside the activity's 120 s start-to-close timeout even when that cap is raised.
COMMAND_TIMEOUT_S = 110.0


class RunPythonArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="Python 3 source to run with the sandbox's /usr/bin/python3; print what you need.")


class RunShellArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(description="A /bin/sh command line, run in /workspace (no network access).")


class WriteFileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="File path relative to /workspace; parent directories are created.")
    content: str = Field(description="The complete text to write (UTF-8); an existing file is replaced.")


class ReadFileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="File path relative to /workspace (at most 1 MiB is returned).")


def script_name(code: str) -> str:
    """The workspace file ``run_python`` writes ``code`` to (named by content, so a retry rewrites the same file).

    Predictable, so the sandboxed code may have put something else there (a FIFO, a
    symlink): the backend's ``write_file`` refuses anything but a regular file, and
    the model reads why.
    """
    return f".agent_run_{hashlib.sha256(code.encode()).hexdigest()[:8]}.py"


def _sandbox(ctx: ToolContext) -> Sandbox:
    if ctx.sandbox is None:
        # a wiring bug in the worker, not something the model can fix: let the activity fail
        raise RuntimeError(f"tool {ctx.invocation.tool!r} needs a sandbox but none is attached")
    sandbox: Sandbox = ctx.sandbox
    return sandbox


@contextmanager
def _refusals_to_model() -> Iterator[None]:
    """Every sandbox refusal (bad path, missing file, a sandbox that cannot isolate) becomes text the model reads.

    Retrying cannot fix any of them, so none fails the activity.
    """
    try:
        yield
    except SandboxError as exc:
        raise ToolError(str(exc)) from None


@tool(
    "run_python",
    description=(
        "Run a Python 3 program in an isolated sandbox (no network, files persist in /workspace for this run) "
        "and return its exit code, stdout and stderr."
    ),
    args=RunPythonArgs,
    side_effect=False,  # confined to the sandbox: nothing outside it changes
    uses_sandbox=True,
    timeout_s=120,
    max_attempts=2,
    heartbeat_s=0,
)
async def run_python(args: RunPythonArgs, ctx: ToolContext) -> str:
    sandbox = _sandbox(ctx)
    script = script_name(args.code)
    with _refusals_to_model():
        await sandbox.write_file(script, args.code.encode())
        result = await sandbox.run(["/usr/bin/python3", "-E", "-s", script], timeout_s=COMMAND_TIMEOUT_S)
    return result.render()


@tool(
    "run_shell",
    description=(
        "Run a shell command (/bin/sh -c) in an isolated sandbox (no network, files persist in /workspace "
        "for this run) and return its exit code, stdout and stderr."
    ),
    args=RunShellArgs,
    side_effect=False,
    uses_sandbox=True,
    timeout_s=120,
    max_attempts=2,
    heartbeat_s=0,
)
async def run_shell(args: RunShellArgs, ctx: ToolContext) -> str:
    with _refusals_to_model():
        result = await _sandbox(ctx).run(["/bin/sh", "-c", args.command], timeout_s=COMMAND_TIMEOUT_S)
    return result.render()


@tool(
    "write_file",
    description="Write a text file in the sandbox's /workspace (replacing it if it exists).",
    args=WriteFileArgs,
    side_effect=False,
    uses_sandbox=True,
    timeout_s=30,
    max_attempts=3,
)
async def write_file(args: WriteFileArgs, ctx: ToolContext) -> str:
    data = args.content.encode()
    with _refusals_to_model():
        await _sandbox(ctx).write_file(args.path, data)
    return f"wrote {len(data)} bytes to {args.path}"


@tool(
    "read_file",
    description="Read a text file from the sandbox's /workspace (at most 1 MiB).",
    args=ReadFileArgs,
    side_effect=False,
    uses_sandbox=True,
    timeout_s=30,
    max_attempts=3,
)
async def read_file(args: ReadFileArgs, ctx: ToolContext) -> str:
    with _refusals_to_model():
        data = await _sandbox(ctx).read_file(args.path)
    return data.decode("utf-8", errors="replace")

"""The ``Sandbox`` protocol every backend implements, and its errors."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel


class SandboxError(Exception):
    """The sandbox could not do what was asked (shown to the model as a tool error)."""


class SandboxUnavailable(SandboxError):
    """The backend cannot isolate at all (e.g. ``bwrap`` missing): fail closed, never run unsandboxed."""


class CommandResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_ms: int = 0

    def render(self) -> str:
        """The text the model reads."""
        parts = [f"exit_code: {self.exit_code}" + (" (timed out)" if self.timed_out else "")]
        parts.append("stdout:\n" + self.stdout if self.stdout else "stdout: (empty)")
        parts.append("stderr:\n" + self.stderr if self.stderr else "stderr: (empty)")
        if self.truncated:
            parts.append("(output truncated at the sandbox's output limit)")
        return "\n".join(parts)


class Sandbox(Protocol):
    """One isolated workspace for a run."""

    sandbox_id: str

    async def run(
        self, argv: list[str], *, stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = ""
    ) -> CommandResult: ...

    async def write_file(self, path: str, content: bytes) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def kill(self) -> None: ...


class SandboxBackend(Protocol):
    name: str

    async def create(self, sandbox_id: str, *, metadata: dict[str, str]) -> Sandbox:
        """Create (idempotently: an existing sandbox with this id is returned) and return it."""
        ...

    async def connect(self, sandbox_id: str) -> Sandbox: ...

"""The ``Sandbox`` protocol every backend implements, and its errors.

Errors, and what the tool activity does with them:

* :class:`SandboxError` — the sandbox refused or could not do what was asked (bad
  path, missing file, a sandbox that is gone): shown to the model as a tool error.
* :class:`SandboxMissing` (a ``SandboxError``) — the sandbox expired or was killed.
  ``connect_or_recreate`` turns the first one into a fresh sandbox and says so.
* :class:`SandboxUnavailable` (a ``SandboxError``) — the backend cannot isolate at
  all (``bwrap`` missing, E2B key rejected): fail closed, never run unsandboxed.
* :class:`SandboxTransient` — *not* a ``SandboxError``: a rate limit, timeout or
  5xx from a remote backend. It propagates out of the activity so that Temporal
  retries it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Protocol

from pydantic import BaseModel

# Keys of the ``metadata`` that ``sandbox_create`` passes to ``create``.
META_RUN = "conversation_id"
META_TENANT = "tenant"

WORKSPACE = "/workspace"  # where every backend puts the run's files

RECREATED_NOTE = (
    "[sandbox] note: this run's sandbox had expired or was lost and has been recreated; "
    "files written to /workspace earlier are gone."
)


class SandboxError(Exception):
    """The sandbox could not do what was asked (shown to the model as a tool error)."""


class SandboxUnavailable(SandboxError):
    """The backend cannot isolate at all (e.g. ``bwrap`` missing): fail closed, never run unsandboxed."""


class SandboxMissing(SandboxError):
    """The sandbox does not exist (any more): it expired, was killed or was never created."""


class SandboxTransient(RuntimeError):
    """A retryable backend failure (rate limit, timeout, 5xx).

    Deliberately not a :class:`SandboxError`: the tool activity turns those into a
    tool error for the model, while this one must fail the attempt so that Temporal
    retries it.
    """


SANDBOX_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
MAX_READ_BYTES = 1024 * 1024  # read_file's cap, whatever the backend


def validate_command(argv: list[str], timeout_s: float) -> None:
    """``SandboxError`` for a command no backend can run: no argv, or a wall time that is not positive."""
    if not argv:
        raise SandboxError("empty command")
    if timeout_s <= 0:
        raise SandboxError(f"timeout_s must be positive, got {timeout_s}")


def validate_sandbox_id(sandbox_id: str) -> None:
    """Refuse ids that are not a single safe path component (every backend uses them as names)."""
    if not SANDBOX_ID_RE.match(sandbox_id) or sandbox_id in (".", ".."):
        raise SandboxError(f"invalid sandbox id {sandbox_id!r}: use 1-80 characters of A-Z a-z 0-9 _ . -")


def workspace_relative(path: str, *, allow_root: bool = False) -> PurePosixPath:
    """A workspace-relative path from the model's ``path`` (``/workspace/x`` is accepted as ``x``).

    Lexical only (``..`` is left for the backend to resolve against the real tree);
    :class:`SandboxError` for empty paths, NULs and absolute paths outside the workspace.
    """
    if not path or "\x00" in path:
        raise SandboxError(f"invalid path {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        try:
            pure = pure.relative_to(WORKSPACE)
        except ValueError:
            raise SandboxError(f"path {path!r} is outside the workspace; use a path relative to {WORKSPACE}") from None
    if pure == PurePosixPath(".") and not allow_root:
        raise SandboxError(f"path {path!r} names the workspace itself, not a file")
    return pure


@dataclass(frozen=True)
class SandboxRecord:
    """One sandbox as its backend lists it (what the reaper decides on)."""

    sandbox_id: str  # the logical id (``sbx-...``), the one the workflow keeps
    run_id: str  # the conversation id it was created for ("" when unknown)
    tenant: str = ""
    ref: str = ""  # the backend's own id (E2B sandbox id; local: the directory)
    created_at: float | None = None  # unix time, when known
    metadata: dict[str, str] = field(default_factory=dict)


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

    async def connect(self, sandbox_id: str) -> Sandbox:
        """Attach to an existing sandbox; :class:`SandboxMissing` when there is none."""
        ...

    async def connect_or_recreate(self, sandbox_id: str, *, metadata: dict[str, str] | None = None) -> Connection:
        """``connect``; when the sandbox is missing, create it again once and report ``recreated=True``.

        A sandbox that is missing again right after being recreated raises
        :class:`SandboxMissing` (no loop).
        """
        ...

    async def kill(self, sandbox_id: str) -> bool:
        """Kill the sandbox by id (idempotent); ``True`` if something was killed."""
        ...

    async def list_sandboxes(self) -> list[SandboxRecord]:
        """Every sandbox this backend owns (for the reaper)."""
        ...


@dataclass(frozen=True)
class Connection:
    """What ``connect_or_recreate`` found: the sandbox, and whether it had to be recreated."""

    sandbox: Sandbox
    recreated: bool = False

    def note(self) -> str:
        """Text to put in front of the tool's output ("" unless recreated)."""
        return RECREATED_NOTE if self.recreated else ""

"""What every command of ``starter.py`` shares: the error type, the argument parser, JSON output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, NoReturn

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings

QUERY_TIMEOUT = timedelta(seconds=10)
# A command: the connected client, its parsed arguments and the process's settings → the exit code.
Command = Callable[[Client, argparse.Namespace, Settings], Awaitable[int]]


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """Usage errors become a one-line ``CliError`` with exit code 2 (instead of argparse's usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {message} (see --help)", code=2)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
event_offset = _int_at_least(0, "an offset (0 or more)")


def name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one tool name")
    return names


async def describe_run(
    client: Client, workflow_id: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    """The run's handle and description; a run that does not exist is a one-line ``CliError``."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        return handle, await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no run with id {workflow_id!r}") from None
        raise

"""Small process helpers the test servers and worker processes share: free ports, open ports, ``PATH``."""

from __future__ import annotations

import os
import socket

from activities.settings import ConfigurationError, Settings


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


def inherited_path() -> str:
    """This process's ``PATH`` for a child process, read the way the project reads its environment (through
    ``Settings``, its one reader), or the system default when it is unset."""
    try:
        return Settings.from_env().environ.get("PATH", os.defpath)
    except ConfigurationError:  # another variable is malformed; PATH itself is only passed on
        return os.defpath

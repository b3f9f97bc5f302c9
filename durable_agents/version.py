"""The installed package's version (``durable-agents --version``, ``durable_agents.__version__``)."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "durable-agents"


def package_version() -> str:
    """The version of the installed ``durable-agents`` distribution; ``0+unknown`` when it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"

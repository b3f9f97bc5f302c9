"""Durable Agents: AI agents as Temporal workflows.

The embedding API is :class:`DurableAgentsPlugin`; ``worker.py`` and ``starter.py``
are the entry points built on it.
"""

from durable_agents.plugin import DurableAgentsPlugin

__all__ = ["DurableAgentsPlugin"]

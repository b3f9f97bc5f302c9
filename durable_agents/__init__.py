"""Durable Agents: AI agents as Temporal workflows.

Everything an application, a tool author or a provider author touches is importable from here::

    from durable_agents import AgentInput, AgentResult, DurableAgentsPlugin, ToolContext, tool

The embedding API is :class:`DurableAgentsPlugin`; ``worker.py`` and ``starter.py`` (the
``durable-agents-worker`` and ``durable-agents`` commands) are the entry points built on it.

Importing this package loads nothing but this module: each name is imported from its home
module on first use (PEP 562). A workflow module can therefore import it at the top,
inside Temporal's workflow sandbox, and ``DurableAgentsPlugin`` passes the project's own
modules through that sandbox. The old import paths (``activities.tools``,
``activities.models``, ``activities.settings``, ``workflows.types``) keep working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from activities.memory import MemoryEntry, MemoryStore, MemoryStoreError, RunMemory
    from activities.models import (
        FatalProviderError,
        ModelProvider,
        ProviderError,
        ProviderRegistry,
        ProviderReply,
        RetryableProviderError,
        provider,
    )
    from activities.settings import ConfigurationError, Settings
    from activities.tools import Recovery, ToolContext, ToolError, ToolRegistry, ToolSpec, tool
    from durable_agents.agent_client import (
        AgentClient,
        AgentClientError,
        DecisionRefused,
        DeltaSource,
        EventCursor,
        ForkPlan,
        InvalidRequest,
        InvalidSchedule,
        MessageRefused,
        NoAnswer,
        NoSuchStep,
        NotAnAgentRun,
        PendingItem,
        PendingPage,
        RunDescription,
        RunEvent,
        RunExists,
        RunNotFound,
        RunNotOpen,
        RunPage,
        RunRef,
        RunSummary,
        ScheduleExists,
        ScheduleInfo,
        ScheduleNotFound,
        ScheduleRun,
        SessionSend,
    )
    from durable_agents.client import connect, exit_process
    from durable_agents.forgetting import ForgetReport, forget_tenant
    from durable_agents.plugin import DurableAgentsPlugin
    from durable_agents.streaming import DeltaReader
    from workflows.run_failure import result_of_failure
    from workflows.session_types import SendResult, SessionMessage, SessionSpec
    from workflows.types import (
        AgentInput,
        AgentResult,
        AnswerSignal,
        AskHumanArgs,
        DecisionRecord,
        Limits,
        MemorySpec,
        Message,
        RecordedToolCall,
        RememberedApproval,
        StatusView,
        SubagentDef,
        ToolInvocation,
        Usage,
    )

# Public name -> the module it lives in (and is imported from on first use).
_HOMES: dict[str, str] = {
    # embedding
    "DurableAgentsPlugin": "durable_agents.plugin",
    "Settings": "activities.settings",
    "ConfigurationError": "activities.settings",
    "connect": "durable_agents.client",
    "exit_process": "durable_agents.client",
    "result_of_failure": "workflows.run_failure",  # a run's AgentResult from its failure (AGENT_FAIL_WORKFLOW_ON_ERROR)
    # front ends: the typed client over a Temporal Client (what the CLI and the HTTP API use)
    "AgentClient": "durable_agents.agent_client",
    "AgentClientError": "durable_agents.agent_client",
    "DecisionRefused": "durable_agents.agent_client",
    "DeltaSource": "durable_agents.agent_client",
    "EventCursor": "durable_agents.agent_client",
    "ForkPlan": "durable_agents.agent_client",
    "InvalidRequest": "durable_agents.agent_client",
    "MessageRefused": "durable_agents.agent_client",
    "NoAnswer": "durable_agents.agent_client",
    "NoSuchStep": "durable_agents.agent_client",
    "NotAnAgentRun": "durable_agents.agent_client",
    "PendingItem": "durable_agents.agent_client",
    "PendingPage": "durable_agents.agent_client",
    "RunDescription": "durable_agents.agent_client",
    "RunEvent": "durable_agents.agent_client",
    "RunExists": "durable_agents.agent_client",
    "RunNotFound": "durable_agents.agent_client",
    "RunNotOpen": "durable_agents.agent_client",
    "RunPage": "durable_agents.agent_client",
    "RunRef": "durable_agents.agent_client",
    "RunSummary": "durable_agents.agent_client",
    "SessionSend": "durable_agents.agent_client",
    "InvalidSchedule": "durable_agents.agent_client",
    "ScheduleExists": "durable_agents.agent_client",
    "ScheduleInfo": "durable_agents.agent_client",
    "ScheduleNotFound": "durable_agents.agent_client",
    "ScheduleRun": "durable_agents.agent_client",
    "DeltaReader": "durable_agents.streaming",  # a run's streamed model text (AgentClient's deltas source)
    # the run contract
    "AgentInput": "workflows.types",
    "AgentResult": "workflows.types",
    "AnswerSignal": "workflows.types",
    "AskHumanArgs": "workflows.types",
    "DecisionRecord": "workflows.types",
    "RememberedApproval": "workflows.types",
    "Limits": "workflows.types",
    "MemorySpec": "workflows.types",
    # deleting a tenant's data (what ``durable-agents forget`` runs)
    "forget_tenant": "durable_agents.forgetting",
    "ForgetReport": "durable_agents.forgetting",
    "Message": "workflows.types",
    "RecordedToolCall": "workflows.types",
    "StatusView": "workflows.types",
    "SubagentDef": "workflows.types",
    "ToolInvocation": "workflows.types",
    "Usage": "workflows.types",
    # sessions
    "SessionSpec": "workflows.session_types",
    "SessionMessage": "workflows.session_types",
    "SendResult": "workflows.session_types",
    # tools
    "tool": "activities.tools",
    "ToolContext": "activities.tools",
    "ToolError": "activities.tools",
    "ToolRegistry": "activities.tools",
    "ToolSpec": "activities.tools",
    "Recovery": "activities.tools",
    # long-term memory (``ToolContext.memory``)
    "MemoryEntry": "activities.memory",
    "MemoryStore": "activities.memory",
    "MemoryStoreError": "activities.memory",
    "RunMemory": "activities.memory",
    # model providers
    "provider": "activities.models",
    "ModelProvider": "activities.models",
    "ProviderReply": "activities.models",
    "ProviderError": "activities.models",
    "RetryableProviderError": "activities.models",
    "FatalProviderError": "activities.models",
    "ProviderRegistry": "activities.models",
}

__all__ = [
    "AgentClient",
    "AgentClientError",
    "AgentInput",
    "AgentResult",
    "AnswerSignal",
    "AskHumanArgs",
    "ConfigurationError",
    "DecisionRecord",
    "DecisionRefused",
    "DeltaReader",
    "DeltaSource",
    "DurableAgentsPlugin",
    "EventCursor",
    "FatalProviderError",
    "ForgetReport",
    "ForkPlan",
    "InvalidRequest",
    "InvalidSchedule",
    "Limits",
    "MemoryEntry",
    "MemorySpec",
    "MemoryStore",
    "MemoryStoreError",
    "Message",
    "MessageRefused",
    "ModelProvider",
    "NoAnswer",
    "NoSuchStep",
    "NotAnAgentRun",
    "PendingItem",
    "PendingPage",
    "ProviderError",
    "ProviderRegistry",
    "ProviderReply",
    "RecordedToolCall",
    "Recovery",
    "RememberedApproval",
    "RetryableProviderError",
    "RunDescription",
    "RunEvent",
    "RunExists",
    "RunMemory",
    "RunNotFound",
    "RunNotOpen",
    "RunPage",
    "RunRef",
    "RunSummary",
    "ScheduleExists",
    "ScheduleInfo",
    "ScheduleNotFound",
    "ScheduleRun",
    "SendResult",
    "SessionMessage",
    "SessionSend",
    "SessionSpec",
    "Settings",
    "StatusView",
    "SubagentDef",
    "ToolContext",
    "ToolError",
    "ToolInvocation",
    "ToolRegistry",
    "ToolSpec",
    "Usage",
    "__version__",
    "connect",
    "exit_process",
    "forget_tenant",
    "provider",
    "result_of_failure",
    "tool",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its home module now (nothing heavy is loaded at ``import durable_agents``).

    Not cached on this module: inside the workflow sandbox the home module may be the sandbox's own copy,
    and a cached value would leak it to the host (``sys.modules`` keeps the lookup cheap).
    """
    if name == "__version__":
        from durable_agents.version import package_version

        return package_version()
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'durable_agents' has no attribute {name!r}")
    # The import statement (``__import__``), not importlib: inside the sandbox it goes through the sandbox's
    # importer, which passes the module through from the host or imports it under the sandbox's rules.
    module = __import__(home, fromlist=[name])
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""Tools of the operator's MCP servers (``AGENT_MCP_CONFIG``), run as durable, approvable activities.

``config`` reads the servers file, ``pool`` manages the server processes and sessions, ``catalog``
lists and snapshots a run's tools and validates the model's calls, ``results`` turns a tool result
into text for the model, and ``activity`` is the ``mcp`` activity.
"""

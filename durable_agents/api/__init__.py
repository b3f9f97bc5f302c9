"""The HTTP API of ``starter.py serve`` (needs the ``server`` extra: FastAPI and uvicorn).

``create_app(client, tokens=...)`` builds it over an ``AgentClient``; every request is scoped to its
bearer token's tenant (``AGENT_API_TOKENS_FILE``). Import this package only where the extra is
installed: ``durable_agents`` itself does not import it.
"""

"""A user's own tools, tested with ``durable_agents.testing`` (``test_my_tool.py``)."""

"""``AgentWorkflow`` embedded in your own Temporal application: ``workflows.py``, ``worker.py``, ``starter.py``."""

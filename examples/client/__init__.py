"""``AgentClient`` from your own code: start a run, follow its events, approve what it asks (``inbox.py``)."""

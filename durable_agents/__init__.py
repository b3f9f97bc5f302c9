"""Process plumbing shared by ``worker.py`` and ``starter.py``: Temporal client and logging."""

"""Schedules from Python: an agent task every weekday morning and a message to a session (``morning.py``)."""

"""A session from Python: start it, send messages, read its status, close it, wake it (``chat.py``)."""

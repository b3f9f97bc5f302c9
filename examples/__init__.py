"""Runnable examples: a custom tool, a custom model provider, an embedded worker, a session from Python.

Each is run by ``tests/test_examples*.py``; ``examples/README.md`` says how to run them by hand.
"""

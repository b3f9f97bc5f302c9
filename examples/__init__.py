"""Runnable examples of the extension API: a custom tool, a custom model provider, an embedded worker.

Each is run by ``tests/test_examples.py``; ``examples/README.md`` says how to run them by hand.
"""

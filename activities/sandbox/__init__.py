"""Sandboxes for model-generated code: one per run, never the worker's process."""

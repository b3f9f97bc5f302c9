"""Sandboxes for model-generated code: one per run, never the worker's process.

* :mod:`activities.sandbox.base`: the ``Sandbox`` / ``SandboxBackend`` protocols and their errors;
* :mod:`activities.sandbox.checkpointable`: what a checkpoint is, and what a backend implements to take one;
* :mod:`activities.sandbox.local`: the bubblewrap backend; :mod:`activities.sandbox.e2b`: the E2B backend;
* :mod:`activities.sandbox.factory`: the backend ``AGENT_SANDBOX`` names;
* :mod:`activities.sandbox.activity`: ``sandbox_create`` / ``sandbox_kill``;
  :mod:`activities.sandbox.reaper`: killing the sandboxes of closed runs.

Nothing here imports the model, tool, runtime, checkpoint or store layers (``tests/test_layering.py``).
"""

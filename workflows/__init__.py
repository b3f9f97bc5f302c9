"""Deterministic workflow code: the agent loop, policy and the data contract."""

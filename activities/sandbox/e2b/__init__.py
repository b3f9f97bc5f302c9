"""The E2B backend: one E2B microVM per sandbox, driven through the ``e2b`` SDK."""

"""A custom model provider: ``AGENT_PROVIDER_MODULES=examples.custom_provider.echo_provider AGENT_MODEL=echo:v1``."""

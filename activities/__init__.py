"""Everything that touches the world: model providers, tools, sandboxes, the run store."""

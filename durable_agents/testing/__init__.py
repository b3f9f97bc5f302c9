"""A test kit for agent authors."""

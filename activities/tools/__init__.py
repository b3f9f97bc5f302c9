"""Tools the model can call: the registry, the built-ins and their activities."""

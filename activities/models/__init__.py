"""Model providers selected by the model string: ``openai:``, ``anthropic:``, ``scripted:``."""

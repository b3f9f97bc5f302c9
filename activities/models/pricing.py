"""Per-model prices in USD per million tokens, overridable by the operator.

``AGENT_PRICES`` names a JSON file ``{"<provider:model>": {"input": 0.15, "output": 0.6}}``
whose entries replace or extend the built-in table. A model missing from the
table costs 0 and the run's ``max_cost_usd`` then only counts priced models.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field


class Price(BaseModel):
    input: float = Field(ge=0)  # USD per 1M input tokens
    output: float = Field(ge=0)  # USD per 1M output tokens


DEFAULT_PRICES: dict[str, Price] = {
    "openai:gpt-4o-mini": Price(input=0.15, output=0.60),
    "openai:gpt-4o": Price(input=2.50, output=10.00),
    "openai:gpt-4.1": Price(input=2.00, output=8.00),
    "openai:gpt-4.1-mini": Price(input=0.40, output=1.60),
    "anthropic:claude-sonnet-4-5": Price(input=3.00, output=15.00),
    "anthropic:claude-haiku-4-5": Price(input=1.00, output=5.00),
    "anthropic:claude-opus-4-1": Price(input=15.00, output=75.00),
    "scripted:demo": Price(input=0.0, output=0.0),
}


@lru_cache(maxsize=8)
def price_table(prices_file: str = "") -> dict[str, Price]:
    table = dict(DEFAULT_PRICES)
    if prices_file:
        raw = json.loads(Path(prices_file).read_text())
        table.update({name: Price.model_validate(p) for name, p in raw.items()})
    return table


def cost_usd(model: str, input_tokens: int, output_tokens: int, prices_file: str = "") -> float:
    price = price_table(prices_file).get(model)
    if price is None:
        return 0.0
    return round((input_tokens * price.input + output_tokens * price.output) / 1_000_000, 8)

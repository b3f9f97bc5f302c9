"""Per-model prices in USD per million tokens, overridable by the operator.

``AGENT_PRICES`` names a JSON file ``{"<provider:model>": {"input": 0.15, "output": 0.6}}``
whose entries replace or extend the built-in table. It is loaded and validated
once, at worker start (:meth:`PriceTable.load`), so a bad file stops the worker
instead of failing model turns that were already paid for. A model missing from
the table costs 0, so ``max_cost_usd`` cannot stop it: the worker warns at start for
its default model, a run of an unpriced model says "cost not tracked" in ``started``
and ``status``, and a run that sets ``max_cost_usd`` itself with one is refused unless
``AGENT_ALLOW_UNPRICED=1``. ``scripted:`` models are offline scripts: priced at $0 on
purpose (:meth:`PriceTable.priced`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from activities.settings import bad_file


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, allow_inf_nan=False)  # USD per 1M input tokens
    output: float = Field(ge=0, allow_inf_nan=False)  # USD per 1M output tokens


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


class PriceTable:
    """Prices by model string; ``cost_usd`` never raises."""

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self._prices = dict(DEFAULT_PRICES if prices is None else prices)

    @classmethod
    def load(cls, prices_file: str = "") -> PriceTable:
        """The built-in table plus ``prices_file``'s entries; ``ConfigurationError`` naming the file if bad."""
        table = dict(DEFAULT_PRICES)
        if prices_file:
            try:
                raw = json.loads(Path(prices_file).read_text())
                if not isinstance(raw, dict):
                    raise ValueError("expected a JSON object of model -> {input, output}")
                table.update({str(name): Price.model_validate(p) for name, p in raw.items()})
            except (OSError, ValueError) as exc:  # ValidationError is a ValueError
                raise bad_file("AGENT_PRICES", prices_file, exc) from None
        return cls(table)

    def get(self, model: str) -> Price | None:
        return self._prices.get(model)

    def priced(self, model: str) -> bool:
        """Whether ``model``'s turns are costed: it is in the table, or an offline ``scripted:`` model ($0)."""
        return model in self._prices or model.startswith("scripted:")

    def unpriced_note(self, model: str) -> str:
        """One line saying why a run of ``model`` has no cost figures, or ``""`` when it is priced."""
        if self.priced(model):
            return ""
        return f"cost not tracked: model {model} has no price, so max_cost_usd is not enforced; set AGENT_PRICES"

    def cost_usd(self, model: str, input_tokens: int, output_tokens: int) -> float:
        price = self._prices.get(model)
        if price is None:
            return 0.0
        return round((input_tokens * price.input + output_tokens * price.output) / 1_000_000, 8)

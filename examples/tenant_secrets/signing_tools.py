"""``sign_invoice``: an HMAC-SHA256 signature of an invoice id, made with the run's tenant's ``SIGNING_KEY``."""

from __future__ import annotations

import hashlib
import hmac

from pydantic import BaseModel, Field

from durable_agents import ToolContext, tool


class SignArgs(BaseModel):
    invoice: str = Field(pattern=r"^INV-\d{1,12}$", description="The invoice id, e.g. INV-1")


def signature(key: str, invoice: str) -> str:
    return hmac.new(key.encode(), invoice.encode(), hashlib.sha256).hexdigest()[:16]


@tool("sign_invoice", description="Sign an invoice id with the tenant's signing key.", args=SignArgs)
async def sign_invoice(args: SignArgs, ctx: ToolContext) -> str:
    # The tenant's own key (a ToolError naming SIGNING_KEY when the tenant has none); it is redacted
    # from whatever this tool returns or raises, so only the signature reaches the model.
    key = ctx.secret("SIGNING_KEY")
    return f"{args.invoice} signature {signature(key, args.invoice)}"

"""Make sure the ``Agent*`` custom search attributes exist on the namespace.

The worker registers any that are missing when it has the rights (dev server,
self-hosted clusters) and otherwise logs one warning and carries on: runs then
simply do not set them (a run never fails because an attribute is missing).
"""

from __future__ import annotations

import structlog
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError

from workflows.progress import SEARCH_ATTRIBUTES

log = structlog.get_logger("search_attributes")

_TYPES = {
    "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    "Double": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE,
}


def create_commands(namespace: str) -> list[str]:
    """The CLI commands an operator runs where the worker lacks the rights."""
    return [
        f"temporal operator search-attribute create --namespace {namespace} --name {name} --type {kind}"
        for name, kind in SEARCH_ATTRIBUTES.items()
    ]


async def ensure_search_attributes(client: Client) -> bool:
    """True when every attribute exists (after registering missing ones), False otherwise."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        missing = {n: k for n, k in SEARCH_ATTRIBUTES.items() if n not in listed.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=client.namespace,
                    search_attributes={n: _TYPES[k] for n, k in missing.items()},
                )
            )
            log.info("search_attributes_registered", names=sorted(missing))
        return True
    except RPCError as err:
        log.warning(
            "search_attributes_unavailable",
            error=err.message,
            hint="runs work without them; to enable, run: " + " && ".join(create_commands(client.namespace)),
        )
        return False

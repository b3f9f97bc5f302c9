"""Tenant-scoped credentials: each tenant's runs sign with that tenant's own key (``ctx.secret``).

Lay out one directory per tenant (a Kubernetes Secret mounted per tenant has this layout)::

    secrets/acme/SIGNING_KEY      secrets/globex/SIGNING_KEY

start a worker with the example's tool and model::

    AGENT_TENANT_SECRETS_DIR=$PWD/secrets \\
    AGENT_TOOL_MODULES=examples.tenant_secrets.signing_tools \\
    AGENT_PROVIDER_MODULES=examples.tenant_secrets.signer_provider AGENT_MODEL=signer:v1 \\
    PYTHONPATH=. durable-agents-worker

and run one invoice for each tenant: ``python -m examples.tenant_secrets.start acme:INV-1 globex:INV-1``.
Each answer carries a signature made with its tenant's key; no key is in the answers, history,
the worker's log or the run store.
"""

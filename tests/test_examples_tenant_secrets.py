"""``examples/tenant_secrets``, run for real: ``worker.py`` with the example's tool and model, and its starter.

Two tenants sign the same invoice; each signature is made with that tenant's own key, and neither key
reaches the starter's output, the worker's log or the run store's files.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from examples.tenant_secrets.signing_tools import signature
from tests.fakes.worker_proc import WorkerProc
from tests.test_examples import example_env, run_example


def test_each_tenant_signs_with_its_own_key(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    keys = {"acme": f"acme-key-{uuid.uuid4().hex}", "globex": f"globex-key-{uuid.uuid4().hex}"}
    secrets = tmp_path / "secrets"
    for tenant, key in keys.items():
        (secrets / tenant).mkdir(parents=True)
        (secrets / tenant / "SIGNING_KEY").write_text(key + "\n")
    env = example_env(
        tmp_path,
        TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
        AGENT_TASK_QUEUE=f"ex-sign-{uuid.uuid4().hex[:8]}",
        AGENT_TOOL_MODULES="examples.tenant_secrets.signing_tools",
        AGENT_PROVIDER_MODULES="examples.tenant_secrets.signer_provider",
        AGENT_MODEL="signer:v1",
        AGENT_TENANT_SECRETS_DIR=str(secrets),
        AGENT_LOG_LEVEL="DEBUG",
    )
    worker = WorkerProc(env, tmp_path / "worker.log").wait_ready(60)
    try:
        run = run_example(
            "examples.tenant_secrets.start", "acme:INV-7", "globex:INV-7", "initech:INV-7", env=env, worker=worker
        )
    finally:
        code = worker.stop()
    assert code == 0, worker.tail()
    assert run.stdout.splitlines() == [
        f"acme: completed: INV-7 signature {signature(keys['acme'], 'INV-7')}",
        f"globex: completed: INV-7 signature {signature(keys['globex'], 'INV-7')}",
        "initech: completed: error: Error: secret 'SIGNING_KEY' is not configured for tenant 'initech'",
    ], run.stdout
    store = b"".join(p.read_bytes() for p in (tmp_path / "state").glob("store.sqlite3*"))
    log = (tmp_path / "worker.log").read_text()
    for key in keys.values():
        assert key not in run.stdout and key not in log and key.encode() not in store

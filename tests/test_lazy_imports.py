"""A worker loads the optional parts only for the features configured (their memory is per process).

Importing ``worker`` (what every worker process does) must not import the OpenTelemetry SDK (only
when tracing is configured), ``cryptography`` (only with encryption keys) or ``jsonschema`` (only
for typed output or MCP tools). Each of them is checked to load when its feature is used.
"""

from __future__ import annotations

import subprocess
import sys

from durable_agents.testing._worker_proc import ROOT

OPTIONAL = ("opentelemetry.sdk", "temporalio.contrib.opentelemetry", "cryptography", "jsonschema")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {OPTIONAL!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return set(done.stdout.split())


def test_importing_the_worker_loads_none_of_them() -> None:
    assert _loaded_after("import worker") == set()


def test_each_loads_with_its_feature() -> None:
    tracing = (
        "import worker\nfrom durable_agents import telemetry\nfrom activities.settings import ObservabilitySettings\n"
        "telemetry.configure_tracing('probe', ObservabilitySettings(trace_exporters=('console',)))"
    )
    assert {"opentelemetry.sdk", "temporalio.contrib.opentelemetry"} <= _loaded_after(tracing)
    keys = "import worker, os\nfrom activities.crypto import KeyRing\nKeyRing([('k1', os.urandom(32))])"
    assert "cryptography" in _loaded_after(keys)
    schema = (
        "import worker\nfrom activities.models.structured import schema_problem\nschema_problem({'type': 'object'})"
    )
    assert "jsonschema" in _loaded_after(schema)

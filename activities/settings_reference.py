"""What every environment variable ``Settings`` reads means: the source of ``docs/reference/configuration.md``.

``Settings`` (activities/settings/) stays the only reader of the environment; this table only describes
what it reads. ``scripts/gen_docs.py`` takes each variable's type from the ``Settings`` code that parses it
and its default from ``Settings.from_env({})`` at ``field``, and writes the page; ``tests/test_docs.py``
fails when a variable ``Settings`` reads is missing here (or listed here but no longer read), and when the
committed page differs from what the generator writes now (``make docs-gen`` regenerates it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    section: str
    meaning: str
    field: str = ""  # dotted path into Settings.from_env({}) whose value is the default
    default: str = ""  # shown instead, for a default that is computed or depends on another variable
    kind: str = ""  # shown instead of the type read from the code, where Settings parses the text itself


TEMPORAL = "Temporal"
MODELS = "Models"
SANDBOX = "Sandboxes"
CHECKPOINTS = "Checkpoints"
POLICY = "Policy, approvals and cost"
EXTENSIONS = "Extensions, MCP and sub-agents"
STORE = "Run store and state"
WORKER = "Worker"
OBSERVABILITY = "Logs, metrics and traces"
ENCRYPTION = "Encryption and the codec server"
MEMORY = "Long-term memory"
API = "HTTP API"

SECTIONS = (
    TEMPORAL,
    MODELS,
    SANDBOX,
    CHECKPOINTS,
    POLICY,
    EXTENSIONS,
    STORE,
    MEMORY,
    WORKER,
    OBSERVABILITY,
    ENCRYPTION,
    API,
)

VARIABLES: tuple[Variable, ...] = (
    # --- Temporal
    Variable("TEMPORAL_ADDRESS", TEMPORAL, "Temporal frontend (host:port).", "temporal.address"),
    Variable("TEMPORAL_NAMESPACE", TEMPORAL, "Temporal namespace.", "temporal.namespace"),
    Variable(
        "TEMPORAL_PROFILE",
        TEMPORAL,
        "A profile of Temporal's `temporal.toml` (TLS, API keys for Temporal Cloud; `temporalio.envconfig` also "
        "reads `TEMPORAL_API_KEY` and `TEMPORAL_TLS_*`).",
        "temporal.profile",
    ),
    Variable("AGENT_TASK_QUEUE", TEMPORAL, "Task queue of workers and the CLI.", "temporal.task_queue"),
    Variable(
        "TEMPORAL_UI_URL",
        TEMPORAL,
        "Base of the links the CLI prints; always denied to `http_request`.",
        "temporal.ui_url",
    ),
    Variable(
        "TEMPORAL_HTTP_PORT",
        TEMPORAL,
        "Temporal's HTTP API port; always denied to `http_request`.",
        default="frontend port + 10",
    ),
    # --- Models
    Variable(
        "AGENT_MODEL",
        MODELS,
        "Default model of runs that name none (`openai:<model>`, `anthropic:<model>`, `scripted:demo`, "
        "`<prefix>:<model>` of a provider module).",
        default="`openai:gpt-4o-mini` with `OPENAI_API_KEY`, else `anthropic:claude-sonnet-4-5` with "
        "`ANTHROPIC_API_KEY`, else `scripted:demo`",
    ),
    Variable("OPENAI_BASE_URL", MODELS, "OpenAI-compatible Chat Completions server.", "openai.base_url"),
    Variable(
        "OPENAI_API_KEY", MODELS, "Its key (sent only as a request header, redacted everywhere).", "openai.api_key"
    ),
    Variable("ANTHROPIC_BASE_URL", MODELS, "Anthropic Messages API.", "anthropic.base_url"),
    Variable("ANTHROPIC_API_KEY", MODELS, "Its key.", "anthropic.api_key"),
    Variable(
        "AGENT_MAX_OUTPUT_TOKENS",
        MODELS,
        "Output cap sent with every model turn (OpenAI `max_tokens`/`max_completion_tokens`, Anthropic "
        "`max_tokens`); a tree's budget reserves it per turn. Lower it for a local server with a small context.",
        "max_output_tokens",
    ),
    # --- Sandboxes
    Variable(
        "AGENT_SANDBOX",
        SANDBOX,
        "Sandbox backend: `local` (bubblewrap) or `e2b`.",
        default="`local` (`e2b` when `E2B_API_KEY` is set)",
        kind="`local` \\| `e2b`",
    ),
    Variable("E2B_API_KEY", SANDBOX, "E2B key; selects the `e2b` backend.", "sandbox.e2b_api_key"),
    Variable(
        "AGENT_SANDBOX_TIMEOUT_S",
        SANDBOX,
        "Wall time of one command (a command's own timeout is capped at it); then its namespace is killed.",
        "sandbox.local.limits.timeout_s",
    ),
    Variable("AGENT_SANDBOX_CPU_S", SANDBOX, "`RLIMIT_CPU` per process.", "sandbox.local.limits.cpu_s"),
    Variable("AGENT_SANDBOX_MEMORY_MB", SANDBOX, "`RLIMIT_AS` per process.", "sandbox.local.limits.memory_mb"),
    Variable(
        "AGENT_SANDBOX_NPROC",
        SANDBOX,
        "`RLIMIT_NPROC`: processes and threads at once (a fork bomb meets `EAGAIN`).",
        "sandbox.local.limits.nproc",
    ),
    Variable(
        "AGENT_SANDBOX_FSIZE_MB",
        SANDBOX,
        "Largest file a command (or `write_file`) may write.",
        "sandbox.local.limits.fsize_mb",
    ),
    Variable("AGENT_SANDBOX_NOFILE", SANDBOX, "Open files per process.", "sandbox.local.limits.nofile"),
    Variable(
        "AGENT_SANDBOX_TMPFS_MB",
        SANDBOX,
        "Size of the in-memory `/tmp` and `/dev/shm`.",
        "sandbox.local.limits.tmpfs_mb",
    ),
    Variable(
        "AGENT_SANDBOX_OUTPUT_BYTES",
        SANDBOX,
        "Stdout and stderr kept per stream; the result says when it was truncated.",
        "sandbox.local.limits.output_bytes",
    ),
    Variable(
        "AGENT_SANDBOX_DISK_MB",
        SANDBOX,
        "The workspace's quota (a loop-mounted ext4 image under a root worker, else measured).",
        "sandbox.local.limits.disk_mb",
    ),
    Variable(
        "AGENT_SANDBOX_UID_BASE",
        SANDBOX,
        "First host uid a root worker hands to sandboxes (1,000,000 uids above it are used).",
        "sandbox.local.uid_base",
    ),
    Variable("AGENT_E2B_TEMPLATE", SANDBOX, "E2B template name or id.", "sandbox.e2b.template"),
    Variable(
        "AGENT_E2B_TIMEOUT_S", SANDBOX, "VM lifetime after its last use (clamped to the max).", "sandbox.e2b.timeout_s"
    ),
    Variable(
        "AGENT_E2B_MAX_TIMEOUT_S",
        SANDBOX,
        "Your E2B plan's cap on the VM timeout (Hobby 3600, Pro 86400).",
        "sandbox.e2b.max_timeout_s",
    ),
    Variable(
        "AGENT_E2B_INTERNET",
        SANDBOX,
        "`1`: the VM may reach the internet.",
        "sandbox.e2b.internet",
        kind="flag (`1`/`0`)",
    ),
    Variable(
        "AGENT_REAP_INTERVAL_S",
        SANDBOX,
        "How often the worker reaps sandboxes of closed runs and unreferenced store blobs (0: never).",
        "sandbox.reap_interval_s",
    ),
    # --- Checkpoints
    Variable(
        "AGENT_CHECKPOINT_MAX_MB",
        CHECKPOINTS,
        "A workspace over this is not checkpointed (the tool's result says so).",
        "checkpoints.max_mb",
    ),
    Variable(
        "AGENT_CHECKPOINT_RETENTION_DAYS",
        CHECKPOINTS,
        "How long closed runs keep their checkpoints (to be forked).",
        "checkpoints.retention_days",
    ),
    Variable(
        "AGENT_RUN_RETENTION_DAYS",
        CHECKPOINTS,
        "Runs closed longer ago than this lose their transcripts, checkpoints and blobs (a blob another run "
        "still uses stays); the worker's reaper deletes them.",
        default="unset: kept",
        kind="number (days, > 0)",
    ),
    Variable(
        "AGENT_CHECKPOINT_RUN_MAX_MB",
        CHECKPOINTS,
        "What one run's checkpoints may add to the run store in all (new bytes after dedupe).",
        default="4 × `AGENT_CHECKPOINT_MAX_MB`",
    ),
    Variable(
        "AGENT_CHECKPOINT_RUN_MAX_COUNT",
        CHECKPOINTS,
        "Distinct checkpoints one run may record; past either cap its checkpoints stop and the run goes on.",
        "checkpoints.run_max_count",
    ),
    Variable(
        "AGENT_ALLOW_FORK_INPUT",
        CHECKPOINTS,
        "`0`: a run input's `fork` (and so `durable-agents fork`) is refused; `rewind` still works.",
        "allow_fork_input",
    ),
    # --- Long-term memory
    Variable(
        "AGENT_MEMORY_MAX_ENTRIES",
        MEMORY,
        "Entries one namespace (tenant, user) may hold; a `memory_save` past it is refused and the model reads why.",
        "memory.max_entries",
    ),
    Variable(
        "AGENT_MEMORY_MAX_MB",
        MEMORY,
        "Text one namespace's entries may hold in all; a `memory_save` past it is refused.",
        "memory.max_mb",
    ),
    Variable(
        "AGENT_MEMORY_TTL_DAYS",
        MEMORY,
        "Entries expire this long after their last save: never returned again, deleted by the worker's reaper.",
        "memory.ttl_days",
        default="unset: entries never expire",
    ),
    # --- Policy, approvals and cost
    Variable(
        "AGENT_HTTP_ALLOW",
        POLICY,
        "Comma-separated `host` (ports 80 and 443), `host:port` or `host:low-high` that `http_request` may reach.",
        "http_allow",
        default="empty: no egress",
    ),
    Variable(
        "AGENT_POLICY_FILE",
        POLICY,
        "The operator's approval policy (JSON), snapshotted into each run at its start.",
        "policy_file",
        default="unset: the built-in defaults",
    ),
    Variable(
        "AGENT_APPROVAL_KEY",
        POLICY,
        "HMAC key: only decisions signed with it count (the CLI signs when it has it).",
        "approval_key",
    ),
    Variable(
        "AGENT_PRICES",
        POLICY,
        'JSON price table (`{"openai:my-model": {"input": 0.5, "output": 1.5}}`, USD per million tokens) '
        "over the built-in one.",
        "prices_file",
        default="unset: the built-in table",
    ),
    Variable(
        "AGENT_ALLOW_UNPRICED",
        POLICY,
        "`1`: a run may set `max_cost_usd` with a model that has no price (its cost stays untracked).",
        "allow_unpriced",
    ),
    Variable(
        "AGENT_FAIL_WORKFLOW_ON_ERROR",
        POLICY,
        "`1`: a run that ends `failed` or `limit_exceeded` fails its workflow (`AgentRunFailed`, the "
        "`AgentResult` in the failure's details); taken at each run's start.",
        "fail_workflow_on_error",
    ),
    Variable("USER", POLICY, "Default reviewer name of the CLI's decisions.", "reviewer"),
    # --- Extensions, MCP and sub-agents
    Variable(
        "AGENT_TOOL_MODULES",
        EXTENSIONS,
        "Comma-separated Python modules whose `@tool` functions the worker registers.",
        "extensions.tool_modules",
    ),
    Variable(
        "AGENT_PROVIDER_MODULES",
        EXTENSIONS,
        'Comma-separated Python modules whose `@provider("prefix")` factories the worker registers.',
        "extensions.provider_modules",
    ),
    Variable(
        "AGENT_MCP_CONFIG",
        EXTENSIONS,
        "The operator's MCP servers (JSON, `mcpServers`), checked at start.",
        "mcp_config",
    ),
    Variable(
        "AGENT_TENANT_SECRETS_DIR",
        EXTENSIONS,
        'Tenants\' credentials for tools: the file `<dir>/<tenant>/<NAME>` is `ctx.secret("NAME")` (and '
        "`${secret:NAME}` of a `per_run` MCP server) in that tenant's runs; a Kubernetes Secret mounted as "
        "`<dir>/<tenant>` has this layout. Unset: tenants have no secrets.",
        "tenant_secrets_dir",
    ),
    Variable(
        "AGENT_TENANT_SECRETS_FALLBACK",
        EXTENSIONS,
        "`1`: a secret the run's tenant does not have is the worker's environment variable of that name "
        "(never an `AGENT_*`, `TEMPORAL_*` or provider setting).",
        "tenant_secrets_fallback",
    ),
    Variable(
        "AGENT_SUBAGENTS_FILE",
        EXTENSIONS,
        "Operator-defined sub-agents (JSON), validated at start.",
        "subagents_file",
    ),
    Variable(
        "AGENT_MAX_SUBAGENT_CALLS_PER_TURN",
        EXTENSIONS,
        "Sub-agent calls one model turn may make (0: any); the extra calls get a tool error.",
        "max_subagent_calls_per_turn",
    ),
    Variable("AGENT_MAX_TREE_RUNS", EXTENSIONS, "Runs one tree may hold, its root included.", "max_tree_runs"),
    Variable("AGENT_MAX_DEPTH", EXTENSIONS, "Ceiling of every run's and sub-agent's `limits.max_depth`.", "max_depth"),
    Variable(
        "AGENT_TENANT_MAX_OPEN_RUNS",
        POLICY,
        "Open top-level runs and sessions one tenant may have (0: any number); a run over it fails at its start, "
        "naming the limit.",
        "tenant_max_open_runs",
    ),
    # --- Run store and state
    Variable(
        "AGENT_STORE_URL",
        STORE,
        "Run store (transcripts and idempotency ledger): a SQLite path, `postgresql://…` or a libpq conninfo; "
        "a SQLite path holding `password=` is refused.",
        default="`$AGENT_STATE_DIR/store.sqlite3`",
    ),
    Variable(
        "AGENT_STATE_DIR",
        STORE,
        "Local state: the SQLite run store, the local sandboxes' workspaces.",
        "state_dir",
    ),
    Variable(
        "AGENT_REQUIRE_SHARED_STORE",
        STORE,
        "`1`: the worker refuses to start (exit 2) unless `AGENT_STORE_URL` is PostgreSQL.",
        "worker.require_shared_store",
        kind="flag (`1`/`0`)",
    ),
    # --- Worker
    Variable(
        "AGENT_MAX_CACHED_WORKFLOWS",
        WORKER,
        "Workflows kept in the worker's cache (0: replay every task); see bench/README.md for the memory figures.",
        "worker.max_cached_workflows",
    ),
    Variable(
        "AGENT_MAX_CONCURRENT_ACTIVITIES",
        WORKER,
        "Activity tasks (model turns, tool calls) one worker runs at once.",
        "worker.max_concurrent_activities",
    ),
    Variable(
        "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS",
        WORKER,
        "Workflow tasks one worker runs at once (at least 2).",
        "worker.max_concurrent_workflow_tasks",
    ),
    Variable("AGENT_HEALTH_PORT", WORKER, "Serve `/healthz` and `/readyz` on `0.0.0.0:N`.", "worker.health_port"),
    Variable(
        "AGENT_HEAP_TRIM_INTERVAL_S",
        WORKER,
        "How often `worker.py` gives freed heap back to the OS when more than 16 MB of it is free "
        "(glibc's `malloc_trim`; 0: never).",
        "worker.heap_trim_interval_s",
    ),
    # --- Logs, metrics and traces
    Variable(
        "AGENT_LOG_LEVEL",
        OBSERVABILITY,
        "Worker log level (structlog JSON, pretty on a terminal).",
        "observability.log_level",
        kind="`DEBUG` \\| `INFO` \\| `WARNING` \\| `ERROR` \\| `CRITICAL`",
    ),
    Variable(
        "AGENT_METRICS_PORT",
        OBSERVABILITY,
        "Serve Prometheus metrics on `0.0.0.0:N/metrics`.",
        "observability.metrics_port",
    ),
    Variable(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        OBSERVABILITY,
        "OTLP/HTTP endpoint of a trace collector; turns tracing on.",
        default="unset: no tracing",
    ),
    Variable(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        OBSERVABILITY,
        "The same, for traces only (used when `OTEL_EXPORTER_OTLP_ENDPOINT` is unset).",
        default="unset",
    ),
    Variable(
        "OTEL_TRACES_EXPORTER",
        OBSERVABILITY,
        "`otlp`, `console` (one JSON span per line on stderr) or `none`; comma-separated for several.",
        default="`otlp` when an endpoint is set, else none",
    ),
    Variable("OTEL_EXPORTER_OTLP_PROTOCOL", OBSERVABILITY, "OTLP protocol.", "observability.otlp_protocol"),
    Variable(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        OBSERVABILITY,
        "The same, for traces only (wins over `OTEL_EXPORTER_OTLP_PROTOCOL`).",
        "observability.otlp_protocol",
    ),
    Variable(
        "OTEL_SERVICE_NAME",
        OBSERVABILITY,
        "Service name of the spans.",
        default="`durable-agents-worker` / `durable-agents-starter`",
    ),
    Variable(
        "OTEL_TRACES_SAMPLER",
        OBSERVABILITY,
        "When set, the OpenTelemetry SDK's own sampler configuration is used.",
        default="unset: every trace",
    ),
    # --- Encryption and the codec server
    Variable(
        "AGENT_PAYLOAD_KEYS",
        ENCRYPTION,
        "Key ring `id:<base64 of 32 bytes>,...`: the first key encrypts, any decrypts.",
        default="unset: payloads and the run store stay plaintext",
        kind="secret key ring",
    ),
    Variable(
        "AGENT_PAYLOAD_KEYS_FILE",
        ENCRYPTION,
        "A file holding the same text instead (not both).",
        default="unset",
        kind="path",
    ),
    Variable(
        "AGENT_CODEC_TOKEN",
        ENCRYPTION,
        "Bearer token the codec server requires.",
        "encryption.codec_token",
        default="unset: no token",
    ),
    Variable(
        "AGENT_CODEC_CORS_ORIGINS",
        ENCRYPTION,
        "Browser origins the codec server allows.",
        "encryption.codec_origins",
    ),
    Variable(
        "AGENT_CODEC_MAX_PAYLOADS",
        ENCRYPTION,
        "Payloads per codec-server request (more: 413).",
        "encryption.codec_max_payloads",
    ),
    Variable(
        "AGENT_CODEC_DEADLINE_S",
        ENCRYPTION,
        "A codec-server request not decoded by then gets 503/504 and its work is abandoned.",
        "encryption.codec_deadline_s",
    ),
    Variable(
        "AGENT_UI_CODEC_ENDPOINT",
        ENCRYPTION,
        "`make server` passes it to the dev server's `--ui-codec-endpoint`.",
        "encryption.ui_codec_endpoint",
    ),
    # --- The HTTP API
    Variable("AGENT_API_PORT", API, "Port `starter.py serve` listens on (`--port` wins).", "api.port"),
    Variable(
        "AGENT_API_TOKENS_FILE",
        API,
        'Tenant tokens of the HTTP API: JSON `{"tokens": [{"sha256", "tenant", "roles", "reviewer"}]}` (the '
        "SHA-256 of each bearer token, never the token), re-read when it changes. Unset: `serve` refuses to "
        "start unless `--insecure-local`.",
        "api.tokens_file",
        default="unset",
        kind="path",
    ),
    Variable(
        "AGENT_API_MAX_BODY_BYTES", API, "Largest request body the HTTP API reads (more: 413).", "api.max_body_bytes"
    ),
    Variable(
        "AGENT_API_RATE_PER_MINUTE",
        API,
        "Requests one token may make a minute (more: 429 with `Retry-After`).",
        "api.rate_per_minute",
    ),
)

"""The docs site: its generated references match their sources, and ``mkdocs build --strict`` passes.

- ``docs/reference/configuration.md`` lists every variable ``Settings`` reads (found in its source) with
  the default ``Settings.from_env({})`` holds; adding a setting without describing it in
  ``activities/settings_reference.py`` and regenerating (``make docs-gen``) fails here.
- ``docs/reference/contract.md`` is what the contract's pydantic models say now.
- The site builds in strict mode: a broken link, anchor or docstring reference fails it.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from activities.settings import ConfigurationError, Settings
from activities.settings_reference import VARIABLES, Variable
from scripts import gen_docs

ROOT = Path(__file__).resolve().parent.parent


def test_the_configuration_page_is_what_the_generator_writes_now() -> None:
    committed = gen_docs.CONFIGURATION_PAGE.read_text(encoding="utf-8")
    assert committed == gen_docs.configuration_page(), (
        "docs/reference/configuration.md is stale: run `make docs-gen` and commit it"
    )


def test_the_contract_page_is_what_the_generator_writes_now() -> None:
    committed = gen_docs.CONTRACT_PAGE.read_text(encoding="utf-8")
    stale = "docs/reference/contract.md is stale: run `make docs-gen` and commit it"
    assert committed == gen_docs.contract_page(), stale


def test_every_variable_settings_reads_is_on_the_configuration_page() -> None:
    reads = gen_docs.settings_reads()
    page = gen_docs.CONFIGURATION_PAGE.read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", page, flags=re.MULTILINE))
    assert len(reads) > 60  # the scan finds what Settings reads (it reads ~70 variables)
    missing = sorted(set(reads) - rows)
    assert not missing, f"read by Settings but not on the configuration page: {missing} (run `make docs-gen`)"
    assert not rows - set(reads), f"on the page but no longer read by Settings: {sorted(rows - set(reads))}"


def test_every_variable_settings_reads_is_described() -> None:
    assert gen_docs.check_reference() == [], "describe it in activities/settings_reference.py, then `make docs-gen`"


def test_the_scan_finds_a_variable_a_new_setting_would_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting added to Settings' source is found (so the page test above fails until it is described)."""
    source = Path(gen_docs.settings_sources()[0]).read_text(encoding="utf-8")
    added = source.replace(
        'policy_file=reader.text("AGENT_POLICY_FILE"),',
        'policy_file=reader.text("AGENT_POLICY_FILE"),\n'
        '            brand_new=reader.integer("AGENT_BRAND_NEW", 1, low=0, high=9),',
    )
    assert added != source
    copy = tmp_path / "settings.py"
    copy.write_text(added, encoding="utf-8")
    monkeypatch.setattr(gen_docs, "settings_sources", lambda: [copy])
    assert gen_docs.settings_reads()["AGENT_BRAND_NEW"] == gen_docs.Read("integer", "0–9")
    assert "AGENT_BRAND_NEW: read by Settings but not described" in gen_docs.check_reference()[0]
    with pytest.raises(SystemExit, match="AGENT_BRAND_NEW"):
        gen_docs.configuration_page()


def _changed_value(name: str, read: gen_docs.Read, default: object) -> str:
    if read.kind == "flag":
        return "0" if default else "1"
    if read.kind == "integer":
        low, high = (int(part.replace(",", "")) for part in read.detail.split("–"))
        return str(low if default != low else high)
    return str(float(str(default)) + 1)  # number, positive


@pytest.mark.parametrize(
    "variable",
    [v for v in VARIABLES if v.field and not v.default],
    ids=lambda v: v.name,
)
def test_each_variable_fills_the_field_its_default_is_read_from(variable: Variable) -> None:
    """The default the page shows is the field the variable sets: a value of the variable lands there."""
    read = gen_docs.settings_reads()[variable.name]
    if variable.kind.startswith("flag"):  # parsed by Settings itself, as a flag
        read = gen_docs.Read("flag")
    defaults = Settings.from_env({})

    def value_of(settings: Settings) -> object:
        value: object = settings
        for part in variable.field.split("."):
            value = getattr(value, part)
        return value

    default = value_of(defaults)
    if read.kind in ("flag", "integer", "number", "positive"):
        raw = _changed_value(variable.name, read, default)
    elif read.kind == "names":
        raw = "http://a.example,http://b.example"
    elif variable.name in ("AGENT_LOG_LEVEL",):
        raw = "DEBUG"
    elif variable.name == "AGENT_UI_CODEC_ENDPOINT":
        raw = "http://127.0.0.1:9"
    else:
        raw = "x-changed"
    try:
        changed = value_of(Settings.from_env({variable.name: raw}))
    except ConfigurationError as exc:  # pragma: no cover - a sample the variable refuses is a test bug
        pytest.fail(f"{variable.name}={raw!r}: {exc}")
    assert changed != default, f"{variable.name}={raw!r} did not change Settings.{variable.field}"


def test_settings_reference_fields_exist() -> None:
    defaults = Settings.from_env({})
    for variable in VARIABLES:
        value: object = defaults
        for part in [p for p in variable.field.split(".") if p]:
            assert hasattr(value, part), f"{variable.name}: Settings has no {variable.field}"
            value = getattr(value, part)


def strict_build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the site whose ``mkdocs.yml`` is in ``project``, into ``site``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)},
    )


def test_the_docs_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link or anchor, a page outside the nav or a bad reference fails."""
    done = strict_build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "DurableAgentsPlugin" in api and "RetryableProviderError" in api  # rendered from the docstrings


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The strict build really catches a link to a page that does not exist."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(
        (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:")[0] + "\nnav:\n  - Home: index.md\n",
        encoding="utf-8",
    )
    done = strict_build(tmp_path, tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stdout + done.stderr


def test_no_page_points_outside_the_repository_or_narrates_history() -> None:
    pages = [*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md", ROOT / "bench" / "README.md"]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        # a relative path that climbs out of the checkout names something a user of the docs does not have
        for climb in re.findall(r"(?:\.\./)+[\w.-]*", text):
            target = (page.parent / climb).resolve()
            assert target.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: {climb!r} points outside the repository"
        for phrase in ("used to be", "was 1.", "once broke", "issue 2", "no longer", " before it)"):
            assert phrase not in text, f"{page.relative_to(ROOT)}: {phrase!r} narrates history"


def test_every_public_name_is_in_the_api_reference() -> None:
    import durable_agents

    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: durable_agents\.(\w+)$", page, flags=re.MULTILINE))
    public = set(durable_agents.__all__) - {"__version__"}
    assert documented == public, f"missing: {sorted(public - documented)}; not public: {sorted(documented - public)}"


def _help_of(command: tuple[str, ...]) -> str:
    """What ``durable-agents COMMAND --help`` prints, from the CLI's own parser (no process per command)."""
    from durable_agents.cli.main import build_parser

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit) as leaving:
        build_parser("durable-agents").parse_args([*command, "--help"])
    assert leaving.value.code == 0, (command, shown.getvalue())
    return shown.getvalue()


def test_every_flag_the_cli_reference_shows_is_the_cli_s_own() -> None:
    """``docs/reference/cli.md``: each command line names a real command, and its flags are in that command's help."""
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    lines = [line.split("  #")[0] for line in page.splitlines() if line.startswith("durable-agents ")]
    assert len(lines) > 10
    helps: dict[tuple[str, ...], str] = {}
    for line in lines:
        words = line.split()
        command = tuple(words[1:3] if words[1] in ("sandboxes", "memory", "schedule") else words[1:2])
        if command not in helps:
            helps[command] = _help_of(command)
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line):
            assert flag in helps[command], f"`durable-agents {' '.join(command)}` has no {flag}: {line}"


# Variables the docs name that Settings does not read, and who reads them.
READ_BY_OTHERS = {
    "AGENT_TEST_REAL_E2B": "the E2B tests (real service instead of the fake)",
    "OTEL_EXPORTER_OTLP_HEADERS": "the OpenTelemetry SDK",
    "OTEL_RESOURCE_ATTRIBUTES": "the OpenTelemetry SDK",
    "TEMPORAL_API_KEY": "temporalio.envconfig",
    "TEMPORAL_TLS_": "temporalio.envconfig",
    "TEMPORAL_CODEC_ENDPOINT": "the Temporal UI server",
}


def test_every_variable_the_docs_name_is_one_something_reads() -> None:
    """A variable named in the README or the docs is read by Settings (or by the library named above)."""
    reads = set(gen_docs.settings_reads())
    pattern = re.compile(r"(?<![A-Z0-9_])((?:AGENT|TEMPORAL|OPENAI|ANTHROPIC|E2B|OTEL)_[A-Z0-9_]*)")
    for page in [*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"]:
        for name in set(pattern.findall(page.read_text(encoding="utf-8"))):
            prefix = name.endswith("_") and any(read.startswith(name) for read in reads)
            where = page.relative_to(ROOT)
            assert name in reads or prefix or name in READ_BY_OTHERS, f"{where}: {name} is read by nothing"

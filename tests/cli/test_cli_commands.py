"""lint, backends, logging formats and the command dispatcher."""

from __future__ import annotations

from pathlib import Path

from moe_policy.cli import app as cli
from tests.bundled import REPO
from tests.cli.runner import H200, NEMOTRON_REL, run_cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lint"
CONFIGS = [
    "configs/default.yaml",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "configs" / "profiles").glob("*.yaml")),
]


def test_lint_finds_nothing_in_configs():
    """The built-in policy and every profile lint clean (what `make lint-policy` runs)."""
    run = run_cli("lint", "--json", *CONFIGS)
    assert run.returncode == 0, run.stdout
    report = run.json()
    assert (report["findings"], report["errors"], report["files"]) == ([], 0, CONFIGS)
    assert len(CONFIGS) >= 4


def test_lint_reports_planted_defects_and_exits_1():
    """A fixture with defects: exit 1, each finding with severity, code, message and file:line:col."""
    path = str((FIXTURES / "structural.yaml").relative_to(REPO))
    run = run_cli("lint", "--json", path)
    assert run.returncode == 1
    findings = run.json()["findings"]
    assert findings and all(
        set(f) == {"severity", "code", "message", "location", "origin"} for f in findings
    )
    assert {"location": f"{path}:3:1", "code": "unknown-key"} in [
        {"location": f["location"], "code": f["code"]} for f in findings
    ]
    human = run_cli("lint", path)
    assert human.returncode == 1
    assert f"{path}:3:1" in human.stdout and "unknown-key" in human.stdout


def test_backends_lists_the_catalog_as_json_and_as_a_table():
    """`backends --json` carries every catalog backend; the table fits 100 columns."""
    from moe_policy.core.catalog import load_catalog

    run = run_cli("backends", "--json")
    assert run.returncode == 0
    backends = {b["name"]: b for b in run.json()["backends"]}
    catalog = load_catalog()
    assert list(backends) == list(catalog.names)
    assert backends["triton"]["implemented_here"] is True
    assert backends["flashinfer_trtllm"]["implemented_here"] is False
    assert backends["flashinfer_trtllm"]["lora"] == "conditional"
    table = run_cli("backends")
    assert table.returncode == 0
    assert max(len(line) for line in table.stdout.splitlines()) <= 100
    assert all(name in table.stdout for name in catalog.names)


def test_log_format_console_is_not_json_and_stdout_stays_clean():
    """--log-format console renders events for people on stderr; --json output is unaffected."""
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--lora",
        "--json",
        "--log-format",
        "console",
        env={"MOE_POLICY_BACKEND": "flashinfer_cutlass"},
    )
    assert run.returncode == 0
    assert run.json()["backend"] == "triton"
    assert run.events() == []
    assert "moe_policy.request_overridden" in run.stderr and "env:MOE_POLICY_BACKEND" in run.stderr


def test_dispatcher_lists_commands_in_one_tuple():
    """COMMANDS is the one list of subcommands: every cli module with add_parser and run."""
    assert cli.COMMANDS[:5] == ("explain", "lint", "backends", "diff", "plan")
    for name, module in cli.command_modules().items():
        assert callable(module.add_parser) and callable(module.run), name
    modules = Path(cli.__file__).parent.glob("*.py")
    commands = {p.stem for p in modules if "\ndef add_parser(" in p.read_text()}
    assert commands == set(cli.COMMANDS)


def test_dispatcher_imports_only_the_named_command():
    """The command named on the line is the only module built into the parser."""
    assert cli.requested_commands(["backends", "--json"]) == ("backends",)
    assert cli.requested_commands(["--version"]) == cli.COMMANDS
    parser = cli.build_parser(cli.command_modules(("backends",)))
    assert parser.parse_args(["backends", "--json"]).command == "backends"


def test_cli_path_imports_neither_torch_nor_triton():
    """`moe-policy explain` decides without importing the kernels' dependencies."""
    import subprocess
    import sys

    code = (
        "import sys; from moe_policy.cli import main; "
        f"main(['explain', '--model', {NEMOTRON_REL!r}, '--platform', 'cuda', '--capability', '9.0', '--json']); "
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert done.stderr.strip().splitlines()[-1] == "[]"


def test_in_process_main_returns_the_code_and_leaves_the_collector_alone(capsys):
    """main(argv) returns its exit code; only the console script (argv=None) tunes gc."""
    import gc
    import json

    import structlog

    frozen = gc.get_freeze_count()
    try:
        assert cli.main(["backends", "--json"]) == 0
    finally:
        structlog.reset_defaults()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert json.loads(capsys.readouterr().out)["catalog"] == "configs/backends.yaml"


def test_lint_checks_a_policy_against_the_engine_it_is_for():
    """vLLM's built-in policy names moonep: a vLLM backend, unknown to this package's layer."""
    vllm_default = "configs/engines/vllm-0.33/default.yaml"
    assert run_cli("lint", "--engine", "vllm", vllm_default).returncode == 0
    own = run_cli("lint", vllm_default)
    assert own.returncode == 1
    assert "unknown-backend" in own.stdout and "'moonep'" in own.stdout
    bad = run_cli("lint", "--engine", "vllm==9.1", vllm_default)
    assert bad.returncode == 2
    assert bad.errors() == [
        "moe-policy: error: cli:--engine: no profile describes vllm 9.1 (its backends and rules "
        "may differ); known: vllm==0.33"
    ]

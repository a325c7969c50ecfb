"""backends, lint, plan and diff on a real terminal: laid out for its width, nothing split.

Each command runs as the installed console script in a pseudo-terminal of 80 and of 160
columns. Every line fits (a line may overflow only where it is one word too long for any
line), every word of the same layout rendered in process with no width limit is printed
whole, no path or identifier is cut, COLUMNS through a pipe gives the terminal's layout, and
the machine formats do not depend on the width at all.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.bundled import QWEN3, REPO
from tests.cli.pty_runner import run_in_terminal
from tests.cli.runner import run_cli

LINT_FILES = tuple(
    str(p.relative_to(REPO)) for p in sorted((REPO / "tests" / "fixtures" / "lint").glob("*.yaml"))
)
DEFAULT = REPO / "configs" / "default.yaml"
RULE = "  - id: hopper-demotes-flashinfer\n"
B200 = ("--platform", "cuda", "--capability", "10.0")
RULE_LINE = re.compile(r"^-+$")


def words(text: str) -> Counter[str]:
    """The words of ``text`` without table rules and the '|' between a difference's sides
    (a difference too long for one line prints its sides on lines of their own)."""
    return Counter(w for w in text.split() if not RULE_LINE.match(w) and w != "|")


def assert_fits(lines: list[str], columns: int) -> None:
    """Every line fits ``columns``, except a line that is one word (its indent aside)."""
    over = [line for line in lines if len(line) > columns and " " in line.strip()]
    assert not over, f"lines wider than {columns} columns:\n" + "\n".join(over)


def terminal(*args: str, columns: int, cwd: Path = REPO) -> list[str]:
    run = run_in_terminal(*args, columns=columns, env={"NO_COLOR": "1"}, cwd=cwd)
    assert run.returncode in (0, 1), run.output
    assert "\x1b" not in run.output
    return run.lines


def on_one_line(lines: list[str], word: str) -> bool:
    return any(word in line for line in lines)


# -- backends ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("columns", "layout"), [(80, "stacked"), (160, "matrix")])
def test_backends_fit_the_terminal_and_split_no_name(columns: int, layout: str) -> None:
    """80 columns: a six-column table with each backend's activations and packages under
    its row; 160: the whole matrix. Every word of the unwrapped layout is printed whole."""
    from moe_policy.cli.backends import render
    from moe_policy.core.catalog import load_catalog

    catalog = load_catalog()
    lines = terminal("backends", columns=columns)
    assert_fits(lines, columns)
    assert words("\n".join(lines)) == words(render(catalog, None, layout))
    header = lines[2].split()
    assert ("activations" in header) is (layout == "matrix")
    for spec in catalog:
        row = next(line for line in lines if line.split()[:1] in ([spec.name], [spec.name + "*"]))
        assert row.split()[1] == spec.platforms[0]  # the facts follow the name on its row
        if layout == "stacked" and spec.packages:
            below = lines[lines.index(row) + 1 :]
            packages = next(line for line in below if line.startswith("    packages: "))
            assert packages.split()[1:] == list(spec.packages)


def test_backends_narrow_terminal_gets_one_block_per_backend() -> None:
    """At 60 columns even the six-column table's words do not fit side by side: each
    backend is a block of ``name: value`` lines, every line within 60 columns."""
    from moe_policy.core.catalog import load_catalog

    out = run_cli("backends", env={"COLUMNS": "60"}).stdout.splitlines()
    assert_fits(out, 60)
    assert max(len(line) for line in out) <= 60
    for spec in load_catalog():
        name = spec.name + ("*" if out.count(spec.name + "*") else "")
        at = out.index(name)
        assert out[at + 1] == f"    platforms: {' '.join(spec.platforms)}"


# -- lint -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def findings() -> tuple[list[tuple[str, str, str, str]], str]:
    """The fixtures' findings (location, severity, code, message) and the summary line."""
    from moe_policy.lint.checks import lint_paths
    from moe_policy.lint.formats import counts, summary

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(REPO)
    try:
        found = lint_paths(LINT_FILES)
    finally:
        monkeypatch.undo()
    rows = [(f.location, f.severity, f.code, f.message) for f in found]
    return rows, summary(len(LINT_FILES), *counts(found))


@pytest.mark.parametrize(("columns", "layout"), [(80, "stacked"), (160, "table")])
def test_lint_text_fits_the_terminal_and_splits_no_location(findings, columns, layout) -> None:
    """80 columns: each message under its finding's row; 160: beside it. Each location is
    printed whole on the line of its severity and code."""
    from moe_policy.cli.lint import render_text

    rows, total = findings
    lines = terminal("lint", *LINT_FILES, columns=columns)
    assert_fits(lines, columns)
    expected = render_text(rows, None, layout) + "\n" + total
    assert words("\n".join(lines)) == words(expected)
    assert lines[0].split() == (
        ["location", "severity", "code"] + ["message"] * (layout == "table")
    )
    for location, severity, code, _message in rows:
        assert any(line.split()[:3] == [location, severity, code] for line in lines), location
    # a path inside a message stays whole too
    inner = {w for *_, message in rows for w in message.split() if w.startswith("(file:")}
    assert inner and all(on_one_line(lines, w) for w in inner)


# -- plan -------------------------------------------------------------------------------------


@pytest.fixture()
def audited(tmp_path: Path) -> Path:
    """configs/default.yaml with hopper-demotes-flashinfer set to action: audit, as
    ``policy.yaml`` in ``tmp_path`` (the plans below run there: the origin is short)."""
    text = DEFAULT.read_text()
    assert RULE in text
    path = tmp_path / "policy.yaml"
    path.write_text(text.replace(RULE, RULE + "    action: audit\n", 1))
    return path


def _plan_text(workdir: Path, stacked: bool) -> str:
    from moe_policy.cli.plan import render_table
    from moe_policy.planning import DEFAULT_MATRIX, load_matrix, plan

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(workdir)
    try:
        result = plan(load_matrix(DEFAULT_MATRIX), [str(DEFAULT)], ["policy.yaml"])
    finally:
        monkeypatch.undo()
    return render_table(result, (str(DEFAULT), "policy.yaml"), None, stacked)


@pytest.mark.parametrize("columns", [80, 160])
def test_plan_fits_the_terminal_and_splits_no_path(audited: Path, columns: int) -> None:
    """80 columns: a row per deployment x platform x layer with its changes under it; 160:
    a row per change. The policy paths and each rule's origin are printed whole."""
    args = ("plan", "--from", str(DEFAULT), "--to", "policy.yaml")
    lines = terminal(*args, columns=columns, cwd=audited.parent)
    stacked = columns == 80
    table_head = next(line for line in lines if line.startswith("deployment "))
    assert table_head.split()[3:4] == ([] if stacked else ["change"])
    assert_fits(lines, columns)
    assert words("\n".join(lines)) == words(_plan_text(audited.parent, stacked))
    assert on_one_line(lines, str(DEFAULT))
    line = next(
        n for n, text in enumerate(DEFAULT.read_text().splitlines(), 1) if text == RULE[:-1]
    )
    assert on_one_line(lines, f"(file:policy.yaml:{line}:5)")
    assert on_one_line(lines, "triton -> flashinfer_cutlass")


def test_plan_long_origin_stays_whole_at_160(tmp_path: Path) -> None:
    """A policy path too long for the rule column puts the changes under the rows at 160
    columns too; the path then overflows no line but its own word."""
    deep = tmp_path / ("policies-" + "x" * 60) / "policy.yaml"
    deep.parent.mkdir()
    deep.write_text(DEFAULT.read_text().replace(RULE, RULE + "    action: audit\n", 1))
    lines = terminal("plan", "--from", "configs/default.yaml", "--to", str(deep), columns=160)
    table_head = next(line for line in lines if line.startswith("deployment "))
    assert table_head.split() == ["deployment", "platform", "layer"]
    assert_fits(lines, 160)
    assert on_one_line(lines, f"(file:{deep}:")


# -- diff -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two decision records for a B200: a dry run, and one with two packages and a policy."""
    tmp = tmp_path_factory.mktemp("diff")
    policy = tmp / "prefer-cutlass.yaml"
    policy.write_text(
        "rules:\n  - {id: prefer-cutlass, effect: prefer, backends: [flashinfer_cutlass], "
        "reason: r}\n"
    )
    a = run_cli("explain", "--model", QWEN3, *B200, "--json")
    b = run_cli(
        "explain",
        "--model",
        QWEN3,
        *B200,
        "--set",
        "packages=[torch, triton]",
        "--json",
        env={"MOE_POLICY_FILES": str(policy)},
    )
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    (tmp / "a.json").write_text(a.stdout)
    (tmp / "b.json").write_text(b.stdout)
    return tmp / "a.json", tmp / "b.json"


@pytest.mark.parametrize("columns", [80, 160])
def test_diff_fits_the_terminal_and_splits_no_path(records, columns: int) -> None:
    """Every line fits; a difference too long for a line puts each side on its own line
    (the packages at 80, where the dry run's origin is long); the paths stay whole."""
    from moe_policy.cli.diff import compare, load, render

    a, b = records
    lines = terminal("diff", str(a), str(b), columns=columns)
    assert_fits(lines, columns)
    unwrapped = render(compare(load(str(a)), load(str(b))), None)
    assert words("\n".join(lines)) == words(unwrapped)
    packages = next(line for line in unwrapped.splitlines() if line.startswith("  packages: "))
    split = len(packages) > columns
    assert ("  packages:" in lines) is split
    if split:
        at = lines.index("  packages:")
        assert lines[at + 1].startswith("    A [")
        assert any(line.startswith("    B [") for line in lines[at + 2 : at + 5])
    else:
        assert packages in lines
    for path in (str(a), str(b), str(a.parent / "prefer-cutlass.yaml")):
        assert on_one_line(lines, path)


# -- COLUMNS and the machine formats ----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("backends",),
        ("lint", *LINT_FILES),
        ("plan", "--from", "configs/default.yaml", "--to", "strict"),
    ],
    ids=["backends", "lint", "plan"],
)
def test_columns_through_a_pipe_gives_the_terminal_layout(args: tuple[str, ...]) -> None:
    """COLUMNS=80 off a terminal prints exactly what an 80-column terminal shows."""
    piped = run_cli(*args, env={"COLUMNS": "80"})
    assert piped.returncode in (0, 1), piped.stderr
    assert piped.stdout.splitlines() == terminal(*args, columns=80)


@pytest.mark.parametrize(
    "args",
    [
        ("backends", "--json"),
        ("lint", "--json", *LINT_FILES),
        *(("lint", "--format", fmt, *LINT_FILES) for fmt in ("lines", "github", "sarif")),
        ("plan", "--from", "configs/default.yaml", "--to", "strict", "--json"),
        ("plan", "--from", "configs/default.yaml", "--to", "strict", "--format", "markdown"),
    ],
    ids=[
        "backends-json",
        "lint-json",
        "lint-lines",
        "lint-github",
        "lint-sarif",
        "plan-json",
        "plan-md",
    ],
)
def test_machine_formats_do_not_depend_on_the_width(args: tuple[str, ...]) -> None:
    """The same bytes at COLUMNS=60 and COLUMNS=160 (and without COLUMNS)."""
    outputs = {
        run_cli(*args, env=env).stdout for env in ({"COLUMNS": "60"}, {"COLUMNS": "160"}, {})
    }
    assert len(outputs) == 1
    assert outputs.pop().strip()


def test_diff_json_does_not_depend_on_the_width(records) -> None:
    a, b = records
    runs = [run_cli("diff", "--json", str(a), str(b), env={"COLUMNS": c}) for c in ("60", "160")]
    assert runs[0].stdout == runs[1].stdout
    assert json.loads(runs[0].stdout)["identical"] is False


# -- every width from the narrowest to the widest ---------------------------------------------

WIDTHS = range(60, 161)


def test_backends_every_width_fits_and_keeps_its_words() -> None:
    from moe_policy.cli.backends import layout_for, render, row
    from moe_policy.core.catalog import load_catalog

    catalog = load_catalog()
    rows = [row(spec, catalog) for spec in catalog]
    seen = set()
    for width in WIDTHS:
        layout = layout_for(rows, width)
        seen.add(layout)
        text = render(catalog, width)
        assert_fits(text.splitlines(), width)
        assert words(text) == words(render(catalog, None, layout)), width
    assert seen == {"matrix", "stacked", "blocks"}


def test_lint_every_width_fits_and_keeps_its_words(findings) -> None:
    from moe_policy.cli.lint import layout_for, render_text

    rows, _ = findings
    seen = set()
    for width in WIDTHS:
        layout = layout_for(rows, width)
        seen.add(layout)
        text = render_text(rows, width)
        assert_fits(text.splitlines(), width)
        assert words(text) == words(render_text(rows, None, layout)), width
        for row in rows:
            assert on_one_line(text.splitlines(), row[0]), (width, row[0])
    assert seen == {"table", "stacked", "blocks"}


def test_plan_every_width_keeps_long_words_whole() -> None:
    """A change whose old value is one 50-column word and whose four rules' origins are
    paths: at no width is a word cut or a line too wide, beside the row or under it."""
    from moe_policy.cli.plan import render_table
    from moe_policy.planning import Cell, Change, Outcome, Plan

    long_class = "VeryLongExpertsClassNameThatCannotBeBrokenAnywhere"
    origin = "file:deploy/policies/hopper.yaml:12:5"
    outcome = Outcome("triton", "TritonExperts", "auto")
    rules = (("hopper-rule", origin), *((f"rule-{n}", f"file:p{n}.yaml:{n}:5") for n in range(3)))
    change = Change("experts_class", long_class, "TritonExperts", rules)
    cells = tuple(
        Cell(
            f"mixtral-tp{n}",
            "mixtral",
            "NVIDIA H100",
            "moe",
            outcome,
            outcome,
            (change,),
            f"mixtral-tp{n}",
        )
        for n in (1, 2)
    )
    result = Plan(cells, decided=4, deployments=2, selectors=2)
    labels = ("configs/default.yaml", "deploy/policies/hopper.yaml")
    layouts = set()
    for width in WIDTHS:
        text = render_table(result, labels, width)
        lines = text.splitlines()
        stacked = next(line for line in lines if line.startswith("deployment")).split()[3:] == []
        layouts.add(stacked)
        assert_fits(lines, width)
        assert words(text) == words(render_table(result, labels, None, stacked)), width
        assert on_one_line(lines, long_class) and on_one_line(lines, f"({origin})")
    assert layouts == {True, False}

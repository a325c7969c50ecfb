"""The README and docs/ say only what is true of the repository.

* every relative link and every backticked repository path names a file that exists (and a
  link's ``#anchor`` a heading of the page it points at);
* README.md stays short and opens with the two set-up commands;
* README, docs and CHANGELOG speak of the project, not of how it was built;
* every ``moe-policy`` command quoted in a console or bash block of README.md or docs/ runs
  with the installed console script and exits as the doc says (``# exit N`` after the
  command, else 0), and a console block's quoted output is in what it prints;
* every policy example (a yaml block with ``version: 1``) lints clean;
* docs/cli.md quotes every command, names each command's options in its ``## COMMAND``
  section, and names no option that no command has.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from moe_policy.cli.parser import Parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
PROSE = [*PAGES, ROOT / "CHANGELOG.md"]

README_MAX_LINES = 250
SETUP_WITHIN_LINES = 15
#: How the project must not speak of itself: work diaries, not the product.
DIARY = re.compile(r"session ?[0-9]|issue ?[0-9]|#[0-9]+ (targets|budget)", re.IGNORECASE)
#: Top-level entries a backticked path may start with.
REPO_DIRS = ("configs/", "moe_policy/", "benchmarks/", "tests/", "scripts/", "docs/", "tools/")
REPO_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
EXIT_NOTE = re.compile(r"#\s*(?:->\s*)?exit\s+(\d+)\s*$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, first line number (1-based) and lines."""

    page: Path
    lang: str
    line: int
    lines: tuple[str, ...]


def blocks(page: Path) -> list[Block]:
    out: list[Block] = []
    lang: str | None = None
    start, body = 0, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if lang is None and match:
            lang, start, body = match.group(1), number, []
        elif lang is not None and line.strip() == "```":
            out.append(Block(page, lang, start, tuple(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


def prose_lines(page: Path) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, with their numbers."""
    out, inside = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line) or (inside and line.strip() == "```"):
            inside = not inside
            continue
        if not inside:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for _, line in prose_lines(page) if re.match(r"^#{1,6} ", line)}


# -- links and paths ---------------------------------------------------------------------


def links(page: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in prose_lines(page) for m in LINK.finditer(line)]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for number, target in links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{rel(page)}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{rel(page)}:{number}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


def repo_path_exists(token: str) -> bool:
    """A backticked path: exists, as a glob matches, or (with a placeholder) its folder exists."""
    token = token.rstrip(".,;:")
    if "{" in token or "<" in token:
        return (ROOT / token.split("{")[0].split("<")[0]).parent.exists()
    if any(ch in token for ch in "*?["):
        return bool(glob.glob(str(ROOT / token)))
    return (ROOT / token).exists()


def backticked_paths(page: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in prose_lines(page):
        for match in INLINE_CODE.finditer(line):
            token = match.group(1).strip()
            if " " in token:
                continue
            if token.startswith(REPO_DIRS) or token in REPO_FILES:
                out.append((number, token))
    return out


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_backticked_paths_exist(page: Path) -> None:
    missing = [
        f"{rel(page)}:{n}: {token}"
        for n, token in backticked_paths(page)
        if not repo_path_exists(token)
    ]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_docs_index_lists_every_page() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index)}
    unlisted = [rel(p) for p in DOCS if p != index and p.resolve() not in linked]
    assert not unlisted, f"docs/README.md does not link {unlisted}"


# -- shape of the README and wording --------------------------------------------------------


def test_readme_is_short() -> None:
    count = len(README.read_text().splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines (at most {README_MAX_LINES})"


def test_readme_opens_with_the_setup_commands() -> None:
    first = blocks(README)[0]
    commands = [ln.split("#")[0].strip() for ln in first.lines if ln.split("#")[0].strip()]
    assert commands[:2] == ["make demo", "make test"], commands
    last_line = first.line + 2  # the fence, then the two commands
    assert last_line <= SETUP_WITHIN_LINES, f"the set-up commands end on line {last_line}"


@pytest.mark.parametrize("page", PROSE, ids=rel)
def test_no_work_diary(page: Path) -> None:
    hits = [
        f"{rel(page)}:{n}: {line.strip()}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if DIARY.search(line)
    ]
    assert not hits, "\n".join(hits)


# -- quoted commands ------------------------------------------------------------------------


@dataclass(frozen=True)
class Quoted:
    """One quoted ``moe-policy`` command with its expected exit code and quoted output."""

    page: Path
    line: int
    command: str
    exit_code: int
    output: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{rel(self.page)}:{self.line}"


def _commands(block: Block) -> list[tuple[int, str, list[str]]]:
    """(line, command, output lines) of a console (``$ ``-prompted) or bash block."""
    out: list[tuple[int, str, list[str]]] = []
    pending: list[str] = []
    for offset, raw in enumerate(block.lines, 1):
        line = raw.rstrip()
        if pending:
            pending.append(line)
        elif block.lang == "console" and line.startswith("$ "):
            pending = [line[2:]]
            start = block.line + offset
        elif block.lang == "bash" and line.strip() and not line.lstrip().startswith("#"):
            pending = [line]
            start = block.line + offset
        elif block.lang == "console" and out:
            out[-1][2].append(line)
            continue
        else:
            continue
        if not line.endswith("\\"):
            out.append((start, " ".join(p.rstrip("\\").strip() for p in pending), []))
            pending = []
    return out


def quoted_commands() -> list[Quoted]:
    found = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang not in ("console", "bash"):
                continue
            for line, command, output in _commands(block):
                words = shlex.split(EXIT_NOTE.sub("", command), comments=True)
                program = next((w for w in words if not ENV_ASSIGNMENT.match(w)), "")
                if program.rsplit("/", 1)[-1] != "moe-policy":
                    continue
                note = EXIT_NOTE.search(command)
                found.append(
                    Quoted(page, line, command, int(note.group(1)) if note else 0, tuple(output))
                )
    return found


QUOTED = quoted_commands()


def console_script() -> str:
    """The installed ``moe-policy`` beside this interpreter, in .venv, or on PATH."""
    for candidate in (
        Path(sys.executable).parent / "moe-policy",
        ROOT / ".venv" / "bin" / "moe-policy",
    ):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("moe-policy")
    assert found, "the moe-policy console script is not installed (pip install -e .)"
    return found


def clean_environ() -> dict[str, str]:
    """The process environment without any policy or vLLM variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MOE_POLICY_", "VLLM_"))}


def run_quoted(quoted: Quoted) -> subprocess.CompletedProcess[str]:
    env = clean_environ()
    argv: list[str] = []
    for word in shlex.split(EXIT_NOTE.sub("", quoted.command), comments=True):
        if not argv and ENV_ASSIGNMENT.match(word):
            name, _, value = word.partition("=")
            env[name] = value
        elif not argv:
            argv.append(console_script())
        elif any(ch in word for ch in "*?[") and glob.glob(str(ROOT / word)):
            argv.extend(sorted(os.path.relpath(p, ROOT) for p in glob.glob(str(ROOT / word))))
        else:
            argv.append(word)
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def squash(text: str) -> str:
    return " ".join(text.split())


def test_readme_quotes_commands() -> None:
    assert any(q.page == README for q in QUOTED), "no moe-policy command found in README.md"


@pytest.mark.parametrize("quoted", QUOTED, ids=lambda q: q.id)
def test_quoted_command_runs(quoted: Quoted) -> None:
    result = run_quoted(quoted)
    said = f"{quoted.id}: `{quoted.command}`"
    assert result.returncode == quoted.exit_code, (
        f"{said} exited {result.returncode}, the doc says {quoted.exit_code}\n"
        f"{result.stderr[-2000:]}"
    )
    printed = squash(result.stdout + "\n" + result.stderr)
    missing = [
        line
        for line in quoted.output
        if line.strip() and not line.strip().startswith("...") and squash(line) not in printed
    ]
    assert not missing, f"{said}: quoted output not printed:\n" + "\n".join(missing)


# -- policy examples ------------------------------------------------------------------------


def policy_examples() -> list[tuple[str, str]]:
    return [
        (f"{rel(b.page)}:{b.line}", "\n".join(b.lines) + "\n")
        for page in PAGES
        for b in blocks(page)
        if b.lang == "yaml" and any(ln.startswith("version: 1") for ln in b.lines)
    ]


@pytest.mark.parametrize(("where", "text"), policy_examples(), ids=lambda v: v.split("\n")[0])
def test_policy_examples_lint_clean(where: str, text: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    result = subprocess.run(
        [console_script(), "lint", str(policy)],
        cwd=ROOT,
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{where}: the example does not lint clean\n{result.stdout}"


# -- the CLI reference ----------------------------------------------------------------------

CLI_DOC = ROOT / "docs" / "cli.md"
#: An option inside inline code (not the ``--flag`` of ``cli:--flag`` or a file name's dash).
OPTION = re.compile(r"(?<![\w:/.*-])-{1,2}[A-Za-z][\w-]*")
#: Options every command has, documented once for all ("On a terminal").
COMMON_OPTIONS = {"-h", "--help", "--color"}


def cli_parser() -> Parser:
    """The CLI's own parser, every command included."""
    from moe_policy.cli.app import build_parser, command_modules

    return build_parser(command_modules())


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


def cli_sections() -> dict[str, list[str]]:
    """The prose lines of docs/cli.md under each ``## NAME`` heading ("" before the first)."""
    sections: dict[str, list[str]] = {"": []}
    name = ""
    for _, line in prose_lines(CLI_DOC):
        heading = re.match(r"^## (\S+)", line)
        if heading:
            name = heading.group(1)
        sections.setdefault(name, []).append(line)
    return sections


def documented_options(lines: list[str]) -> set[str]:
    return {
        opt for line in lines for code in INLINE_CODE.findall(line) for opt in OPTION.findall(code)
    }


def test_cli_doc_lists_every_command() -> None:
    text = CLI_DOC.read_text()
    missing = [name for name in cli_parser().commands if f"`moe-policy {name}" not in text]
    assert not missing, f"docs/cli.md does not quote `moe-policy COMMAND` for {missing}"


def test_cli_doc_names_every_option() -> None:
    sections = cli_sections()
    missing = [
        f"{name}: {sorted(options(sub) - COMMON_OPTIONS - documented_options(sections.get(name, [])))}"
        for name, sub in cli_parser().commands.items()
        if options(sub) - COMMON_OPTIONS - documented_options(sections.get(name, []))
    ]
    assert not missing, "options not named in their docs/cli.md section:\n" + "\n".join(missing)


def test_cli_doc_names_no_unknown_option() -> None:
    parser = cli_parser()
    known = options(parser).union(*(options(sub) for sub in parser.commands.values()))
    named = documented_options([line for lines in cli_sections().values() for line in lines])
    assert named <= known, f"docs/cli.md names options no command has: {sorted(named - known)}"

"""Bounded, safe YAML: hostile documents are one PolicyError at file:line:col, before any
alias is expanded; files that are not regular, too large or not UTF-8 are refused."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from moe_policy.core.catalog import load_catalog
from moe_policy.core.model import load_model
from moe_policy.core.textfile import MAX_FILE_BYTES, read_text
from moe_policy.core.yamlbounds import LIMITS
from moe_policy.core.yamlio import load_yaml_file, parse_yaml_text
from moe_policy.errors import PolicyError
from moe_policy.planning.matrix import load_matrix
from moe_policy.settings import resolve_settings
from tests.cli.runner import H200, NEMOTRON_REL, run_cli


def billion_laughs(levels: int = 9) -> str:
    """Nine lists of nine aliases of the list before: 9**9 strings once expanded."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        items = ",".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{items}]")
    return "\n".join(lines) + "\n"


BOMB = billion_laughs()
#: The alias that takes the bomb past the node limit: the third ``*a4`` of line 6 (each
#: ``*a4`` stands for 66,430 nodes).
BOMB_ALIAS = (6, 18)
DEEP_LIST = "a: " + "[" * 100 + "]" * 100 + "\n"
DEEP_MAP = "".join("  " * i + f"k{i}:\n" for i in range(100))
ALIAS_DEEPENS = (
    "a: &a "
    + "[" * 40
    + "1"
    + "]" * 40
    + "\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*a]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
)

# (id, text, error line, col, message fragment, code)
HOSTILE = [
    ("billion-laughs", BOMB, *BOMB_ALIAS, "alias *a4 expands to 66,430 nodes", "too-large"),
    ("recursive-list", "a: &a [1, *a]\n", 1, 11, "recursive alias *a", "malformed-yaml"),
    ("recursive-map", "a: &a {b: {c: *a}}\n", 1, 15, "recursive alias *a", "malformed-yaml"),
    (
        "complex-key",
        "? [a, b]\n: 1\n",
        1,
        3,
        "a mapping key must be a plain value",
        "malformed-yaml",
    ),
    (
        "flow-complex-key",
        "{[a]: 1}\n",
        1,
        2,
        "a mapping key must be a plain value",
        "malformed-yaml",
    ),
    (
        "alias-as-complex-key",
        "x: &x [1]\n*x : 2\n",
        2,
        1,
        "mapping key must be a plain",
        "malformed-yaml",
    ),
    (
        "python-tag",
        "a: !!python/object/apply:os.system [id]\n",
        1,
        4,
        "python/object/apply",
        "malformed-yaml",
    ),
    ("custom-tag", "mode: !warn strict\n", 1, 7, "tag '!warn' is not allowed", "malformed-yaml"),
    ("binary-tag", "a: !!binary aGVsbG8=\n", 1, 4, "binary' is not allowed", "malformed-yaml"),
    (
        "tag-directive",
        "%TAG !e! tag:example.com,2000:\n---\na: !e!x 1\n",
        1,
        1,
        "%TAG",
        "malformed-yaml",
    ),
    ("huge-int", "version: " + "9" * 4301 + "\n", 1, 10, "4,301 digits", "too-large"),
    ("huge-negative-int", "a: [1, -" + "1" * 5000 + "]\n", 1, 8, "5,000 digits", "too-large"),
    # 60,000 bits: fine for int(), but no error message could print it
    ("huge-hex-int", "a: 0x" + "f" * 15000 + "\n", 1, 4, "more than 4,300 digits", "too-large"),
    ("not-an-int", "parallel: !!int two\n", 1, 11, "'two' is not an integer", "malformed-yaml"),
    ("not-a-float", "a: !!float x\n", 1, 4, "'x' is not a number", "malformed-yaml"),
    ("not-a-bool", "a: !!bool maybe\n", 1, 4, "'maybe' is not a boolean", "malformed-yaml"),
    ("empty-hex", "a: !!int 0x\n", 1, 4, "'0x' is not an integer", "malformed-yaml"),
    ("deep-list", DEEP_LIST, 1, 4 + LIMITS.max_depth - 1, "nested more than 64", "too-large"),
    ("deep-map", DEEP_MAP, 64, 127, "nested more than 64", "too-large"),
    ("alias-deepens", ALIAS_DEEPENS, 2, 34, "alias *a nests the document", "too-large"),
    (
        "too-many-aliases",
        "a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n",
        2,
        5 + 4 * 1000,
        "more than 1,000 aliases",
        "too-large",
    ),
    (
        "too-many-nodes",
        "a: [" + ",".join(["0"] * 250_000) + "]\n",
        1,
        499_999,
        "more than 250,000 nodes",
        "too-large",
    ),
    ("control-character", "mode: warn\nrules: [\x07]\n", 2, 9, "U+0007", "malformed-yaml"),
    ("control-after-utf8", "reason: é\x01\n", 1, 10, "U+0001", "malformed-yaml"),
    ("nul-byte", "mode: warn\x00\n", 1, 11, "U+0000", "malformed-yaml"),
    ("duplicate-key", "mode: warn\nmode: strict\n", 2, 1, "duplicate key 'mode'", "duplicate-key"),
    ("undefined-alias", "mode: *nope\n", 1, 7, "undefined alias", "malformed-yaml"),
    (
        "two-documents",
        "mode: warn\n---\nmode: strict\n",
        2,
        1,
        "another document",
        "malformed-yaml",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "col", "fragment", "code"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_yaml_is_one_error_at_its_position(text, line, col, fragment, code):
    with pytest.raises(PolicyError) as caught:
        parse_yaml_text(text, "p.yaml")
    error = caught.value
    assert error.origin == f"file:p.yaml:{line}:{col}", error
    assert fragment in error.message
    assert error.code == code
    assert "\n" not in str(error)


def test_aliases_within_the_limits_load_and_share_their_value():
    loaded = parse_yaml_text(
        "base: &hopper {platform: cuda, device.capability: '9.0'}\n"
        "rules:\n  - {id: a, when: *hopper}\n  - {id: b, when: *hopper}\n",
        "p.yaml",
    )
    rules = loaded.data["rules"]
    assert rules[0]["when"] == rules[1]["when"] == {"platform": "cuda", "device.capability": "9.0"}
    # positions inside an alias are the anchored node's
    assert str(loaded.origin(("rules", 1, "when", "platform"))) == "file:p.yaml:1:26"


def test_the_largest_integer_allowed_still_prints():
    """The bit limit matches Python's digit limit: the largest hex integer let through can
    still be formatted into an error message."""
    bits = math.floor(LIMITS.max_int_digits / math.log10(2))
    value = parse_yaml_text(f"a: {hex(2**bits - 1)}\n", "p.yaml").data["a"]
    assert len(str(value)) <= LIMITS.max_int_digits
    with pytest.raises(PolicyError, match="too large"):
        parse_yaml_text(f"a: {hex(2**bits)}\n", "p.yaml")


def test_plain_values_stay_plain():
    """Only the JSON types are built: a date stays a string, ``=`` is a string, ``!!str`` works."""
    data = parse_yaml_text("a: 2024-01-01\nb: =\nc: !!str 5\nd: 0x1F\n", "p.yaml").data
    assert data == {"a": "2024-01-01", "b": "=", "c": "5", "d": 31}


def test_values_read_as_omegaconf_and_json_read_them():
    """JSON's ``1e-05`` is a float (YAML 1.1 alone would keep it a string), as OmegaConf
    read policy files before; a model's config.json reads as json.loads reads it."""
    text = '{"eps": 1e-05, "theta": 1E6, "ratio": 0.5, "n": 128, "on": true, "none": null}'
    data = parse_yaml_text(text, "config.json").data
    assert data == json.loads(text)
    assert [type(v) for v in data.values()] == [float, float, float, int, bool, type(None)]
    yaml_text = "a: [1e3, 1.0e+3, .inf, 1_000, off, '1e3', 2024-01-01]\n"
    assert parse_yaml_text(yaml_text, "p.yaml").data == OmegaConf.to_container(
        OmegaConf.create(yaml_text)
    )


def _policy(rules: int) -> str:
    lines = ["version: 1", "rules:"]
    for i in range(rules):
        lines += [
            f"  - id: r{i}",
            f"    when: {{platform: cuda, parallel.tp: {{ge: {i % 8 + 1}}}}}",
            "    effect: demote",
            "    backends: [triton]",
            f"    reason: rule number {i}",
        ]
    return "\n".join(lines) + "\n"


def test_a_policy_of_five_thousand_rules_loads(tmp_path: Path):
    """Far past OmegaConf's 10,000-node default, well inside the limits."""
    policy = tmp_path / "big.yaml"
    policy.write_text(_policy(5000))
    settings = resolve_settings(load_catalog(), policy_files=[str(policy)], environ={})
    mine = [rule for rule in settings.rules if rule.id.startswith("r") and rule.id[1:].isdigit()]
    assert len(mine) == 5000
    assert mine[-1].origin == f"file:{policy}:{2 + 5 * 4999 + 1}:5"


def test_the_alias_bomb_through_the_cli_is_one_error_line(tmp_path: Path):
    policy = tmp_path / "bomb.yaml"
    policy.write_text(BOMB)
    where = f"file:{policy}:{BOMB_ALIAS[0]}:{BOMB_ALIAS[1]}"
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--policy", str(policy))
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.startswith(f"moe-policy: error: {where}: YAML document too large: alias *a4")
    assert run.stderr.count("\n") == 1
    lint = run_cli("lint", "--json", str(policy))
    assert lint.returncode == 1 and "Traceback" not in lint.stderr
    [finding] = lint.json()["findings"]
    assert (finding["code"], finding["origin"]) == ("too-large", where)


# ---------------------------------------------------------------- files


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


def _sparse(tmp_path: Path) -> Path:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    return path


NOT_READABLE = [
    ("fifo", _fifo, "cannot read file: it is a FIFO, not a regular file"),
    (
        "char-device",
        lambda tmp: Path("/dev/zero"),
        "cannot read file: it is a character device, not a regular file",
    ),
    ("directory", lambda tmp: tmp, "cannot read file: it is a directory, not a regular file"),
    (
        "too-large",
        _sparse,
        f"file too large: {MAX_FILE_BYTES + 1:,} bytes (at most {MAX_FILE_BYTES:,})",
    ),
    (
        "name-too-long",
        lambda tmp: tmp / ("p" * 300 + ".yaml"),
        "cannot read file: the path is too long (a name of 305 bytes)",
    ),
    ("not-a-directory", lambda tmp: Path(__file__) / "p.yaml", "cannot read file: Not a directory"),
    ("missing", lambda tmp: tmp / "absent.yaml", "file not found"),
]


@pytest.mark.parametrize(
    ("make", "message"), [c[1:] for c in NOT_READABLE], ids=[c[0] for c in NOT_READABLE]
)
def test_only_regular_files_of_bounded_size_are_read(tmp_path: Path, make, message):
    """Refused without reading: a FIFO would block, /dev/zero would read until MemoryError."""
    path = make(tmp_path)
    with pytest.raises(PolicyError) as caught:
        load_yaml_file(path)
    assert str(caught.value) == f"file:{path}: {message}"
    if os.path.isdir(path):  # a model directory: its config.json is read
        message = "has no config.json"
    with pytest.raises(PolicyError, match=re.escape(message)):
        load_model(path)


def test_invalid_utf8_names_the_line_and_column_of_the_byte(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_bytes(b"mode: warn\nrules:\n  - id: caf\xc3\xa9\xff\n")
    with pytest.raises(PolicyError) as caught:
        read_text(path)
    assert str(caught.value) == f"file:{path}:3:13: invalid UTF-8: byte 0xff (invalid start byte)"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_a_file_in_an_unreadable_directory_is_one_error(tmp_path: Path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "p.yaml").write_text("mode: warn\n")
    locked.chmod(0)
    try:
        with pytest.raises(PolicyError, match=r": cannot read file: Permission denied$"):
            load_yaml_file(locked / "p.yaml")
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize(
    ("make", "message"), [c[1:] for c in NOT_READABLE[:5]], ids=[c[0] for c in NOT_READABLE[:5]]
)
def test_the_cli_refuses_unreadable_policies_and_models(tmp_path: Path, make, message):
    """explain (policy and model) and lint: exit 2 / a finding, one line, never a hang."""
    path = str(make(tmp_path))
    runs = [run_cli("explain", "--model", NEMOTRON_REL, *H200, "--policy", path)]
    if not os.path.isdir(path):  # a directory is a model directory without config.json
        runs.append(run_cli("explain", "--model", path, *H200))
    for run in runs:
        assert (run.returncode, run.stdout) == (2, ""), run.stderr
        assert run.stderr == f"moe-policy: error: file:{path}: {message}\n"
    lint = run_cli("lint", "--json", path)
    assert lint.returncode == 1
    [finding] = lint.json()["findings"]
    assert finding["message"] == message


def test_a_deployment_matrix_is_read_under_the_same_limits(tmp_path: Path):
    fifo = _fifo(tmp_path)
    with pytest.raises(PolicyError, match="it is a FIFO"):
        load_matrix(fifo)
    bomb = tmp_path / "matrix.yaml"
    bomb.write_text(BOMB)
    with pytest.raises(
        PolicyError, match=rf"^file:{re.escape(str(bomb))}:6:18: YAML document too large"
    ):
        load_matrix(bomb)


@pytest.mark.parametrize(
    ("model", "message"),
    [("p" * 300, "unknown model 'ppp"), ("./" + "p" * 300 + ".json", "model config './ppp")],
    ids=["bundled-name", "path"],
)
def test_a_matrix_naming_a_model_too_long_to_exist_is_one_error(tmp_path: Path, model, message):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        f"deployments:\n  - {{name: d, model: {model}, platforms: [{{platform: cpu}}]}}\n"
    )
    with pytest.raises(PolicyError, match=rf"^file:{re.escape(str(matrix))}:2:\d+: {message}"):
        load_matrix(matrix)


def test_marks_are_found_in_the_nodes_for_every_path():
    """Every key path has its value's line:col (and its key's, under a mapping), aliases
    followed; a path the document does not have is not there."""
    loaded = parse_yaml_text(
        "a: &x {b: [1, {c: 2}]}\nd: *x\n" + "".join(f"k{i}: {i}\n" for i in range(20)),
        "p.yaml",
    )
    assert loaded.marks[()] == (1, 1)
    assert loaded.marks[("a", "b", 1, "c")] == loaded.marks[("d", "b", 1, "c")] == (1, 19)
    assert loaded.key_marks[("d",)] == (2, 1) and loaded.key_marks[("k19",)] == (22, 1)
    assert ("a", "b", 1) not in loaded.key_marks  # a list item has no key
    assert ("a", "b", 2) not in loaded.marks and ("a", "z") not in loaded.marks
    assert len(loaded.marks) == 1 + 2 * 5 + 20 and len(loaded.key_marks) == 2 * 3 + 20
    assert all(loaded.marks[path] for path in loaded.marks)

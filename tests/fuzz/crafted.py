"""Crafted hostile inputs, each named by what it tries: policy files (alias bombs,
recursion, deep nesting, tags, huge integers, every OmegaConf resolver, the secret in every
place), model configs, and paths that are not regular files."""

from __future__ import annotations

from typing import Any

from tests.fuzz.mutate import dump_yaml
from tests.fuzz.pool import SECRET_NAME

# --- crafted hostile files --------------------------------------------------------------


def _alias_bomb(levels: int, width: int) -> bytes:
    lines = ["version: 1", 'a0: &a0 ["lol"]']
    for i in range(1, levels):
        refs = ", ".join(f"*a{i - 1}" for _ in range(width))
        lines.append(f"a{i}: &a{i} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


def _rules(count: int) -> bytes:
    rules = [
        {
            "id": f"r{i}",
            "when": {"parallel.tp": {"ge": i % 8 + 1}},
            "effect": "prefer",
            "backends": ["triton"],
            "reason": "r",
        }
        for i in range(count)
    ]
    return dump_yaml({"version": 1, "rules": rules})


def _rule(when: Any, **extra: Any) -> bytes:
    rule = {
        "id": "r",
        "when": when,
        "effect": "prefer",
        "backends": ["triton"],
        "reason": "x",
        **extra,
    }
    return dump_yaml({"version": 1, "rules": [rule]})


CRAFTED_POLICIES: dict[str, bytes] = {
    "billion laughs (9x9)": _alias_bomb(9, 9),
    "alias bomb under 500 bytes": _alias_bomb(12, 6)[:500].rsplit(b"\n", 1)[0]
    + b"\nbackend: triton\n",
    "alias bomb inside a rule": _alias_bomb(8, 8)
    + b"rules:\n  - id: x\n    when: {platform: *a7}\n",
    "merge-key bomb": b"version: 1\nbase: &b {platform: cuda}\n"
    + b"".join(b"m%d: &m%d {<<: [*b, *b]}\n" % (i, i) for i in range(30)),
    "recursive alias": b"version: 1\na: &a [*a]\n",
    "recursive mapping alias": b"version: 1\nrules: &r\n  - id: x\n    when: *r\n",
    "undefined alias": b"version: 1\nbackend: *nothing\n",
    "nesting 100 deep (flow)": b"version: 1\nrules: " + b"[" * 100 + b"]" * 100 + b"\n",
    "nesting 5000 deep (flow)": b"version: 1\nrules: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "nesting 200 deep (block)": b"version: 1\n"
    + b"".join(b" " * i + b"k%d:\n" % i for i in range(200)),
    "unclosed nesting": b"version: 1\nrules: " + b"[" * 3000 + b"\n",
    "python object tag": b"version: 1\nbackend: !!python/object/apply:os.system ['echo pwned']\n",
    "python name tag": b"version: 1\nbackend: !!python/name:os.system\n",
    "custom tag": b"version: 1\nbackend: !triton x\n",
    "%TAG directive": b"%TAG !e! tag:example.com,2000:\n---\nversion: 1\nbackend: !e!triton x\n",
    "binary tag": b"version: 1\nbackend: !!binary aGVsbG8=\n",
    "timestamp value": b"version: 1\nbackend: 2001-12-14t21:59:43.10-05:00\n",
    "set tag": b"version: 1\nrules: !!set {a, b}\n",
    "omap tag": b"version: 1\nrules: !!omap [a: 1]\n",
    "complex key": b"version: 1\n? [a, b]\n: 1\n",
    "mapping key": b"version: 1\n{a: 1}: 2\n",
    "integer key": b"version: 1\n1: 2\n",
    "null key": b"version: 1\n~: 2\n",
    "duplicate key": b"version: 1\nbackend: triton\nbackend: cpu\n",
    "huge int (5000 digits)": b"version: 1\nbackend: " + b"9" * 5000 + b"\n",
    "huge int version": b"version: " + b"1" * 4400 + b"\n",
    "huge int in a rule": _rule({"parallel.tp": {"gt": "zzHUGE4400zz"}}),
    "huge float": b"version: 1\nrules: [{id: r, when: {parallel.tp: {gt: 1e999}}, effect: prefer, backends: [triton], reason: x}]\n",
    "list operand on a numeric key": _rule({"parallel.tp": {"gt": [1]}}),
    "dict operand on a numeric key": _rule({"parallel.tp": {"lt": {"a": 1}}}),
    "multiple_of on a string key": _rule({"device.name": {"multiple_of": 2}}),
    "multiple_of zero": _rule({"parallel.tp": {"multiple_of": 0}}),
    "ordering on a string key": _rule({"platform": {"gt": "cuda"}}),
    "exists as a string": _rule({"lora.enabled": {"exists": "false"}}),
    "platform null": _rule({"platform": None}),
    "capability 9.0000001": _rule({"device.capability": {"ge": "9.0000001"}}),
    "version true": b"version: true\n",
    "version huge": b"version: 99999999999999999999\n",
    "empty audit path": b"version: 1\naudit: {path: ''}\n",
    "audit path as a list": b"version: 1\naudit: {path: [a]}\n",
    "audit path a directory": b"version: 1\naudit: {path: .}\n",
    "audit path /dev/null": b"version: 1\naudit: {path: /dev/null}\n",
    "700 rules": _rules(700),
    "3000 rules": _rules(3000),
    "empty file": b"",
    "only a comment": b"# nothing\n",
    "a list at top level": b"- 1\n- 2\n",
    "a scalar at top level": b"triton\n",
    "two documents": b"version: 1\n---\nversion: 1\n",
    "NUL byte": b"version: 1\nbackend: tri\x00ton\n",
    "control character": b"version: 1\nbackend: \x07triton\n",
    "invalid UTF-8": b"version: 1\nbackend: \xff\xfe\n",
    "UTF-16 BOM": "version: 1\n".encode("utf-16"),
    "tab indentation": b"version: 1\naudit:\n\tpath: x\n",
    "JSON policy": b'{"version": 1, "backend": "triton"}',
    "JSON with duplicate keys": b'{"version": 1, "backend": "triton", "backend": "cpu"}',
    "secret in the reason": _rule({"platform": "cuda"}, reason="${oc.env:" + SECRET_NAME + "}"),
    "secret in the id": dump_yaml(
        {
            "version": 1,
            "rules": [
                {
                    "id": "${oc.env:" + SECRET_NAME + "}",
                    "when": {"platform": "cuda"},
                    "effect": "prefer",
                    "backends": ["triton"],
                    "reason": "x",
                }
            ],
        }
    ),
    "secret in the mode": b"version: 1\nmode: ${oc.env:" + SECRET_NAME.encode() + b"}\n",
    "secret in the backend": b"version: 1\nbackend: ${oc.env:" + SECRET_NAME.encode() + b"}\n",
    "secret as the audit file name": b"version: 1\naudit: {path: '${oc.env:"
    + SECRET_NAME.encode()
    + b"}.jsonl'}\n",
    "secret through oc.decode": b"version: 1\nmode: ${oc.decode:${oc.env:"
    + SECRET_NAME.encode()
    + b"}}\n",
    "secret in a key": b"version: 1\nrules: [{id: r, when: {'${oc.env:"
    + SECRET_NAME.encode()
    + b"}': 1}, effect: prefer, backends: [triton], reason: x}]\n",
    "oc.create": b"version: 1\nrules: ${oc.create:[{id: r}]}\n",
    "oc.select": b"version: 1\nmode: ${oc.select:backend,strict}\n",
    "oc.dict.keys": b"version: 1\nbackend: ${oc.dict.keys:audit}\n",
    "oc.dict.values": b"version: 1\nrules: ${oc.dict.values:audit}\n",
    "oc.deprecated": b"version: 1\nmode: ${oc.deprecated:backend}\n",
    "self reference": b"version: 1\nbackend: ${backend}\n",
    "mutual reference": b"version: 1\nbackend: ${mode}\nmode: ${backend}\n",
    "unknown resolver": b"version: 1\nbackend: ${python.eval:1}\n",
    "unterminated interpolation": b"version: 1\nbackend: ${oc.env:HOME\n",
    "nested interpolation": b"version: 1\nbackend: ${oc.env:${oc.env:HOME}}\n",
    "long line": b"version: 1\nreason: " + b"x" * 2_000_000 + b"\n",
    "long key": b"version: 1\n" + b"k" * 100_000 + b": 1\n",
    # 12,000 nodes: past OmegaConf's old 10,000-node limit; each unknown key is a finding
    # with a did-you-mean (20,000 keys take lint about 8 s, all of it the 20,000 findings).
    "many keys": b"version: 1\n" + b"".join(b"k%d: 1\n" % i for i in range(6_000)),
}

#: Files that are not regular files (created by the pool), used as a policy or model.
SPECIAL_PATHS: dict[str, tuple[dict[str, str], str]] = {
    "a FIFO": ({"input": "fifo"}, "input"),
    "a directory": ({"input": "dir"}, "input"),
    "a dangling symlink": ({"input": "symlink:missing"}, "input"),
    "a symlink loop": ({"input": "symlink:input"}, "input"),
    "/dev/zero": ({}, "/dev/zero"),
    "/dev/null": ({}, "/dev/null"),
    "/dev/urandom": ({}, "/dev/urandom"),
    "/proc/self/environ": ({}, "/proc/self/environ"),
    "a 300-byte name": ({}, "p" * 300 + ".yaml"),
    "a 5000-byte path": ({}, "/".join(["d" * 200] * 25) + "/x.yaml"),
    "a path under a file": ({}, "/etc/hostname/x.yaml"),
    "an empty path": ({}, ""),
    "a path with a NUL-looking escape": ({}, "po\\x00licy.yaml"),
}


CRAFTED_MODELS: dict[str, bytes] = {
    "nesting 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "nesting 1000 deep in a field": b'{"num_experts": ' + b"[" * 1000 + b"]" * 1000 + b"}",
    "huge int": b'{"architectures": ["Qwen3MoeForCausalLM"], "num_experts": ' + b"9" * 5000 + b"}",
    "NaN": b'{"num_experts": NaN, "num_experts_per_tok": 8, "hidden_size": 2048}',
    "Infinity": b'{"num_experts": Infinity}',
    "duplicate keys": b'{"num_experts": 8, "num_experts": 16}',
    "BOM": b"\xef\xbb\xbf{}",
    "invalid UTF-8": b'{"model_type": "\xff"}',
    "lone surrogate escape": b'{"model_type": "\\ud800"}',
    "a list": b"[1, 2, 3]",
    "a string": b'"config"',
    "empty": b"",
    "null": b"null",
    "truncated": b'{"num_experts": 12',
    "10 MB string": b'{"model_type": "' + b"x" * 10_000_000 + b'"}',
    "YAML alias bomb as config.yaml": _alias_bomb(9, 9),
}

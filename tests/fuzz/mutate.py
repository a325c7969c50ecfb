"""Hostile values and the two mutations the generators apply: byte-wise (flips, cuts,
repeats, splices, YAML-significant tokens) and tree-wise (values replaced by hostile ones,
keys added and removed, types changed). Each takes the ``random.Random`` it is given."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import yaml

from moe_policy.core.keys import CONTEXT_KEYS, PLATFORMS
from moe_policy.core.rules import OPERATORS
from moe_policy.settings.schema import TOP_LEVEL_KEYS
from tests.fuzz.pool import SECRET_NAME

BACKENDS = (
    "triton",
    "batched_triton",
    "flashinfer_trtllm",
    "flashinfer_cutlass",
    "aiter",
    "cpu",
    "reference",
    "torch_grouped_mm",
    "auto",
    "marlin",
)


# --- hostile values ---------------------------------------------------------------------

RESOLVERS = (
    "${oc.env:" + SECRET_NAME + "}",
    "${oc.env:" + SECRET_NAME + ",fallback}",
    "${oc.env:HOME}",
    "${oc.env:MOE_POLICY_AUDIT_DIR,/nonexistent}",
    "${oc.env:NO_SUCH_VARIABLE_X}",
    "${oc.decode:'{a: 1}'}",
    "${oc.decode:${oc.env:" + SECRET_NAME + "}}",
    "${oc.create:{a: [1, 2]}}",
    "${oc.select:backend,triton}",
    "${oc.select:nothing.here}",
    "${oc.dict.keys:audit}",
    "${oc.dict.values:audit}",
    "${oc.deprecated:backend}",
    "${backend}",
    "${rules}",
    "${priority.cuda}",
    "${..backend}",
    "${undefined_key}",
    "${oc.env:}",
    "${}",
    "${",
    "${oc.env:" + SECRET_NAME + "} in the middle",
    "$${escaped}",
    "${now:%Y}",
    "${python.eval:1+1}",
)
STRINGS = (
    "",
    " ",
    "\t",
    "false",
    "true",
    "False",
    "no",
    "off",
    "1",
    "0",
    "-1",
    "9.0",
    "9.0000001",
    "99999.99999",
    "10",
    "90",
    "\uff12",  # full-width 2
    "1_000",
    "0x10",
    "1e3",
    "nan",
    "inf",
    "null",
    "~",
    "cuda",
    "CUDA",
    "triton",
    "trition",
    "strict",
    "warn",
    "\u00e9\u4e2d\U0001f600",
    "a" * 300,
    "x" * 5000,
    "line\nbreak",
    "colon: inside",
    "# not a comment",
    "../../etc/passwd",
    "/dev/zero",
    "/dev/null",
    "\x7f\x1b[31m",
    "\u202e",
    "-" * 3,
    "'quoted'",
    '"double"',
    "[1, 2]",
    "{a: 1}",
)


#: Integers too long for Python's int-from-text limit (4,300 digits) cannot be dumped as
#: ints; a placeholder is dumped instead and replaced by the digits afterwards.
HUGE = re.compile(r"[\"']?zzHUGE(-?)(\d+)zz[\"']?")


def huge_int(rng: random.Random) -> Any:
    return rng.choice(["zzHUGE4400zz", "zzHUGE-5000zz", 2**63, 2**64 + 1, 10**20, 2**31])


def _digits(text: str) -> str:
    return HUGE.sub(lambda m: m.group(1) + "9" * int(m.group(2)), text)


def scalar(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.2:
        return rng.choice([0, 1, 2, -1, -5, 7, 128, 1024, 3, 9999])
    if pick < 0.27:
        return huge_int(rng)
    if pick < 0.35:
        return rng.choice(
            [2.7, -0.0, 1e308, float("inf"), float("-inf"), float("nan"), 9.0, 9.0000001]
        )
    if pick < 0.42:
        return rng.choice([True, False, None])
    if pick < 0.62:
        return rng.choice(RESOLVERS)
    if pick < 0.72:
        return rng.choice(BACKENDS + PLATFORMS)
    return rng.choice(STRINGS)


def value(rng: random.Random, depth: int = 0) -> Any:
    """A random YAML value: mostly scalars, sometimes lists, mappings and operator dicts."""
    pick = rng.random()
    if depth > 3 or pick < 0.6:
        return scalar(rng)
    if pick < 0.75:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if pick < 0.87:
        return {rng.choice(OPERATORS): value(rng, depth + 1) for _ in range(rng.randint(1, 2))}
    keys = [
        *CONTEXT_KEYS,
        *TOP_LEVEL_KEYS,
        "id",
        "when",
        "effect",
        "backends",
        "reason",
        "link",
        "bogus",
    ]
    return {rng.choice(keys): value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


# --- tree mutations ---------------------------------------------------------------------


def _containers(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    found = []
    if isinstance(node, (dict, list)):
        found.append((path, node))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            found.extend(_containers(child, (*path, key)))
    return found


def mutate_tree(rng: random.Random, data: Any, ops: int) -> Any:
    """Replace, delete, add, duplicate or re-type nodes of ``data`` (in place; returned)."""
    for _ in range(ops):
        containers = _containers(data)
        if not containers:
            return value(rng)
        _path, node = rng.choice(containers)
        op = rng.random()
        if isinstance(node, dict):
            if node and op < 0.45:
                node[rng.choice(list(node))] = value(rng)
            elif node and op < 0.6:
                del node[rng.choice(list(node))]
            elif node and op < 0.7:
                key = rng.choice(list(node))
                node[key] = rng.choice([[node[key]], {"eq": node[key]}, str(node[key])])
            else:
                keys = [
                    *CONTEXT_KEYS,
                    *TOP_LEVEL_KEYS,
                    *OPERATORS,
                    "id",
                    "effect",
                    "backends",
                    "bogus",
                    "",
                ]
                key: Any = (
                    rng.choice(keys) if rng.random() < 0.9 else rng.choice([1, True, None, 2.5])
                )
                node[key] = value(rng)
        elif isinstance(node, list):
            if node and op < 0.4:
                node[rng.randrange(len(node))] = value(rng)
            elif node and op < 0.55:
                del node[rng.randrange(len(node))]
            elif node and op < 0.75:
                node.append(
                    json.loads(json.dumps(rng.choice(node), default=str))
                    if rng.random() < 0.5
                    else rng.choice(node)
                )
            else:
                node.insert(rng.randint(0, len(node)), value(rng))
    return data


def dump_yaml(data: Any) -> bytes:
    return _digits(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10_000)).encode()


def dump_json(data: Any) -> bytes:
    return _digits(json.dumps(data, indent=1, ensure_ascii=False)).encode("utf-8", "surrogatepass")


# --- byte mutations ---------------------------------------------------------------------

YAML_TOKENS = (
    b"&a ",
    b"*a",
    b"<<: *a\n",
    b"!!python/object/apply:os.system ['true']",
    b"!!binary ",
    b"!custom ",
    b"%TAG ! tag:x,2000:\n---\n",
    b"---\n",
    b"...\n",
    b"? ",
    b": ",
    b"- ",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\t",
    b"\x00",
    b"\xff\xfe",
    b"\xef\xbb\xbf",
    b"\r",
    b"\x0c",
    b"\x1b",
    b"'",
    b'"',
    b"#",
    b"|\n",
    b">-\n",
    b"${oc.env:" + SECRET_NAME.encode() + b"}",
    b"${oc.decode:'[1]'}",
    b"${",
    b"}",
    b"~",
    b"null",
    b"9" * 4400,
    b"0x",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\n  ",
    b"\n- ",
    b"\\",
)


def mutate_bytes(rng: random.Random, data: bytes, ops: int, corpus: tuple[bytes, ...]) -> bytes:
    """Flip, delete, duplicate, splice or insert tokens at random offsets."""
    buf = bytearray(data)
    for _ in range(ops):
        at = rng.randint(0, len(buf))
        op = rng.random()
        if op < 0.2 and buf:
            at = min(at, len(buf) - 1)
            buf[at] = (
                rng.randrange(256) if rng.random() < 0.5 else buf[at] ^ (1 << rng.randrange(8))
            )
        elif op < 0.4:
            del buf[at : at + rng.randint(1, 40)]
        elif op < 0.5:
            span = bytes(buf[at : at + rng.randint(1, 80)])
            buf[at:at] = span * rng.randint(1, 4)
        elif op < 0.6:
            other = rng.choice(corpus)
            start = rng.randint(0, len(other))
            buf[at:at] = other[start : start + rng.randint(1, 200)]
        else:
            buf[at:at] = rng.choice(YAML_TOKENS)
    return bytes(buf)

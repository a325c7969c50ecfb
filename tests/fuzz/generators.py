"""Fuzz case generators: each takes a ``random.Random`` and returns one :class:`Case`.

Four families, one generator each, drawn from the shipped files so most cases are near
misses of valid input rather than noise:

- ``policy_case``: a shipped policy (default, profiles, the vLLM engine profile) mutated
  byte-wise (flips, cuts, splices, YAML-significant tokens) or tree-wise (values replaced
  by hostile ones: huge ints, resolvers, wrong types), or one of :data:`CRAFTED_POLICIES`
  (alias bombs, recursive aliases, deep nesting, tags, every OmegaConf resolver), run
  through ``explain --policy`` or ``lint``;
- ``model_case``: a shipped ``config.json`` mutated the same ways, or a crafted model file;
- ``env_case``: every variable the settings read (and near misses) set to odd values;
- ``flag_case``: ``explain``/``lint``/``backends`` flags with odd values and ``--set`` items.

The generators depend only on the ``Random`` they are given: one seed, one case list.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from functools import cache
from typing import Any

import yaml

from moe_policy.core.keys import CONTEXT_KEYS, PLATFORMS
from moe_policy.core.rules import OPERATORS
from moe_policy.settings.env import OUR_VARIABLES, VLLM_HANDLED, VLLM_KNOWN_NO_EFFECT
from moe_policy.settings.schema import TOP_LEVEL_KEYS
from tests.bundled import REPO
from tests.fuzz.pool import SECRET_NAME, Case

CONFIGS = REPO / "configs"
POLICY_FILES = (
    "default.yaml",
    "profiles/audit.yaml",
    "profiles/prefer-trtllm-lora.yaml",
    "profiles/strict.yaml",
    "engines/vllm-0.33/default.yaml",
)
MODEL_FILES = tuple(sorted(p.name for p in (CONFIGS / "models").glob("*.json")))
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
DEVICES = (
    ("cuda", "9.0", "NVIDIA H200"),
    ("cuda", "10.0", "NVIDIA B200"),
    ("cuda", "8.0", "NVIDIA A100"),
    ("rocm", None, "AMD Instinct MI300X"),
    ("cpu", None, None),
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

#: Crafted policies given to explain only: lint compares every pair of rules (shadowed,
#: conflicting), so 3,000 rules take about half a minute there while the loader takes them
#: in about a second.
EXPLAIN_ONLY = frozenset({"3000 rules"})

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


@cache
def policy_corpus() -> tuple[bytes, ...]:
    return tuple((CONFIGS / name).read_bytes() for name in POLICY_FILES)


@cache
def model_corpus() -> tuple[bytes, ...]:
    return tuple((CONFIGS / "models" / name).read_bytes() for name in MODEL_FILES)


def _model_arg(rng: random.Random) -> str:
    return str(CONFIGS / "models" / rng.choice(MODEL_FILES))


def device_flags(rng: random.Random) -> list[str]:
    platform, capability, name = rng.choice(DEVICES)
    flags = ["--platform", platform]
    if capability:
        flags += ["--capability", capability]
    if name:
        flags += ["--device-name", name]
    return flags


def _explain(rng: random.Random, *extra: str) -> tuple[str, ...]:
    argv = ["explain", "--model", _model_arg(rng), *device_flags(rng), *extra]
    if rng.random() < 0.3:
        argv.append("--lora")
    if rng.random() < 0.5:
        argv.append("--json")
    return tuple(argv)


def _policy_command(rng: random.Random, names: list[str], engine_file: bool) -> tuple[str, ...]:
    engine = ["--engine", "vllm"] if engine_file else []
    pick = rng.random()
    if pick < 0.3:
        return ("lint", *engine, *names)
    if pick < 0.33 and not engine_file:  # what the change does to every deployment
        return ("plan", *(arg for name in names for arg in ("--to", name)))
    policies = [arg for name in names for arg in ("--policy", name)]
    return _explain(rng, *engine, *policies)


def policy_case(rng: random.Random) -> Case:
    """A mutated shipped policy (or a crafted one) through explain or lint."""
    env = {"MOE_POLICY_AUDIT_DIR": "{dir}"}
    pick = rng.random()
    if pick < 0.08:
        note, data = rng.choice(sorted(CRAFTED_POLICIES.items()))
        files = {"policy.yaml": data}
        argv = _policy_command(rng, ["policy.yaml"], False)
        if note in EXPLAIN_ONLY:
            argv = _explain(rng, "--policy", "policy.yaml")
        return Case("policy", argv, env, files, note=f"crafted: {note}")
    index = rng.randrange(len(POLICY_FILES))
    base = policy_corpus()[index]
    engine_file = POLICY_FILES[index].startswith("engines/")
    if pick < 0.55:
        data = mutate_bytes(rng, base, rng.randint(1, 4), policy_corpus())
        note = f"bytes of {POLICY_FILES[index]}"
    else:
        tree = mutate_tree(rng, yaml.safe_load(base), rng.randint(1, 3))
        data = dump_json(tree) if rng.random() < 0.15 else dump_yaml(tree)
        note = f"tree of {POLICY_FILES[index]}"
    files = {"policy.yaml": data}
    names = ["policy.yaml"]
    if rng.random() < 0.1:
        files["second.yaml"] = mutate_bytes(rng, rng.choice(policy_corpus()), 1, policy_corpus())
        names.append("second.yaml")
    return Case("policy", _policy_command(rng, names, engine_file), env, files, note=note)


# --- model configs ----------------------------------------------------------------------

MODEL_FIELDS = (
    "num_experts",
    "n_routed_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "intermediate_size",
    "hidden_size",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "hidden_act",
    "torch_dtype",
    "dtype",
    "architectures",
    "model_type",
    "quantization_config",
    "is_gated",
    "scoring_func",
    "topk_method",
    "norm_topk_prob",
    "n_group",
    "topk_group",
    "text_config",
    "num_hidden_layers",
    "first_k_dense_replace",
    "moe_layer_freq",
    "mlp_only_layers",
    "decoder_sparse_step",
)

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


def mutate_model(rng: random.Random, data: dict[str, Any]) -> dict[str, Any]:
    for _ in range(rng.randint(1, 3)):
        pick = rng.random()
        if pick < 0.6:
            data[rng.choice(MODEL_FIELDS)] = (
                value(rng)
                if rng.random() < 0.7
                else rng.choice(
                    [
                        "false",
                        "true",
                        -3,
                        2.7,
                        True,
                        None,
                        {"a": 1},
                        [],
                        "fp8",
                        {"quant_method": "fp8"},
                        0,
                        "zzHUGE4400zz",
                    ]
                )
            )
        elif pick < 0.75 and data:
            del data[rng.choice(list(data))]
        else:
            mutate_tree(rng, data, 1)
    return data


def model_case(rng: random.Random) -> Case:
    """A mutated shipped config.json (or a crafted one) through explain --model."""
    pick = rng.random()
    name = "config.json"
    if pick < 0.06:
        note, data = rng.choice(sorted(CRAFTED_MODELS.items()))
        if note.endswith("config.yaml"):
            name = "config.yaml"
        note = f"crafted: {note}"
    elif pick < 0.5:
        index = rng.randrange(len(MODEL_FILES))
        data = mutate_bytes(rng, model_corpus()[index], rng.randint(1, 4), model_corpus())
        note = f"bytes of {MODEL_FILES[index]}"
    else:
        index = rng.randrange(len(MODEL_FILES))
        tree = mutate_model(rng, json.loads(model_corpus()[index]))
        data = dump_json(tree)
        note = f"tree of {MODEL_FILES[index]}"
        if rng.random() < 0.15:  # a config.yaml is read too
            name, data, note = "config.yaml", dump_yaml(tree), f"{note} (YAML)"
    if rng.random() < 0.15:  # as a Hugging Face model directory
        name = f"model/{name}"
        model = "model"
    else:
        model = name
    argv = ["explain", "--model", model, *device_flags(rng)]
    if rng.random() < 0.3:
        argv += ["--tp", rng.choice(["1", "2", "4"])]
    if rng.random() < 0.3:
        argv.append("--ep")
    if rng.random() < 0.5:
        argv.append("--json")
    return Case("model", tuple(argv), {}, {name: data}, note=note)


def special_path_case(rng: random.Random) -> Case:
    """A FIFO, device, directory, dangling link or overlong path as the policy, model or audit log."""
    note, (specials, path) = rng.choice(sorted(SPECIAL_PATHS.items()))
    role = rng.choice(["policy", "model", "audit", "lint", "diff"])
    if role == "policy":
        argv = _explain(rng, "--policy", path)
    elif role == "model":
        argv = ("explain", "--model", path, *device_flags(rng))
    elif role == "audit":
        argv = _explain(rng, "--audit-log", path)
    elif role == "diff":
        argv = ("diff", path, path)
    else:
        argv = ("lint", path)
    return Case("special", argv, {}, {}, specials, note=f"{note} as {role}")


# --- environment ------------------------------------------------------------------------

ENV_NAMES = (
    *OUR_VARIABLES,
    *sorted(VLLM_HANDLED),
    *sorted(VLLM_KNOWN_NO_EFFECT),
    "MOE_POLICY_BACKNED",
    "MOE_POLICY_",
    "MOE_POLICY_mode",
    "VLLM_MOE_SOMETHING_NEW",
    "RANK",
    "WORLD_SIZE",
)
ENV_VALUES = (
    *(s for s in STRINGS if "\x00" not in s),
    *BACKENDS,
    "warn",
    "strict",
    "error",
    "aiter",
    "{dir}/audit.jsonl",
    "{dir}",
    "{dir}/missing/dir/audit.jsonl",
    "{dir}/policy.yaml",
    "{dir}/hostile.yaml",
    "{dir}/hostile.yaml:{dir}/policy.yaml",
    "{dir}/fifo",
    "/dev/null",
    "/dev/zero",
    "{dir}/policy.yaml:{dir}/policy.yaml",
    ":::",
    "vllm",
    "vllm==0.33",
    "vllm==9.9",
    "moe_policy",
    "${oc.env:" + SECRET_NAME + "}",
    "-1",
    "99999999999999999999999",
    "\u0661",  # Arabic-Indic one
)


def env_case(rng: random.Random) -> Case:
    """One to three of the variables the settings read (or near misses), odd values."""
    env = {rng.choice(ENV_NAMES): rng.choice(ENV_VALUES) for _ in range(rng.randint(1, 3))}
    hostile = CRAFTED_POLICIES[rng.choice(sorted(CRAFTED_POLICIES.keys() - EXPLAIN_ONLY))]
    files = {
        "policy.yaml": policy_corpus()[rng.randrange(len(POLICY_FILES))],
        "hostile.yaml": hostile,
    }
    specials = {"fifo": "fifo"}
    argv = _explain(rng) if rng.random() < 0.9 else ("lint", "policy.yaml")
    return Case("env", argv, env, files, specials, note="environment")


# --- flags ------------------------------------------------------------------------------

FLAG_VALUES = (
    *STRINGS[:34],
    "2",
    "1024",
    "0",
    "-2",
    "1.5",
    " 2 ",
    "+2",
    "2\n",
    "\u0662",
    "9.0",
    "9",
    "9.",
    ".0",
    "9.0.0",
    "sm_90",
    "1" * 5000,
    "${oc.env:" + SECRET_NAME + "}",
)
VALUE_FLAGS = (
    "--backend",
    "--mode",
    "--max-lora-rank",
    "--max-loras",
    "--platform",
    "--capability",
    "--device-name",
    "--dtype",
    "--tp",
    "--dp",
    "--all2all",
    "--layer-kind",
    "--engine",
    "--log-format",
    "--profile",
)
SWITCHES = (
    "--lora",
    "--ep",
    "--eplb",
    "--json",
    "--help",
    "--version",
    "--bogus",
    "-x",
    "--",
    "--tp=2",
    "--set",
)


def set_item(rng: random.Random) -> str:
    key = rng.choice(
        [
            *CONTEXT_KEYS,
            "backend",
            "mode",
            "audit.path",
            "audit.required",
            "consistency",
            "priority.cuda",
            "rules",
            "bogus.key",
            "",
            " ",
            "a..b",
            "model",
        ]
    )
    raw = rng.choice(
        [
            *FLAG_VALUES[:40],
            "[]",
            "[triton,torch]",
            "[${oc.env:" + SECRET_NAME + "}]",
            "{a: 1}",
            "'quoted'",
            "[",
            "]",
            "${",
            "1" * 4400,
            "true",
        ]
    )
    return f"{key}={raw}" if rng.random() < 0.95 else key


def flag_case(rng: random.Random) -> Case:
    """explain with odd flag values and --set items; now and then lint, backends or no command."""
    pick = rng.random()
    if pick < 0.05:
        commands = ["backends", "lint", "", "nonsense", "--version", "explian", "schema", "models"]
        argv: list[str] = [rng.choice([*commands, "completion", "diff", "plan", "--color"])]
        argv += [rng.choice(SWITCHES + VALUE_FLAGS) for _ in range(rng.randint(0, 2))]
        return Case("flags", tuple(a for a in argv if a), note="command")
    argv = [
        "explain",
        "--model",
        _model_arg(rng) if rng.random() < 0.95 else rng.choice(FLAG_VALUES),
    ]
    argv += device_flags(rng) if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.55:
            argv += [rng.choice(VALUE_FLAGS), rng.choice(FLAG_VALUES)]
        elif choice < 0.85:
            argv += ["--set", set_item(rng)]
        else:
            argv.append(rng.choice(SWITCHES[:3] + SWITCHES[6:]))
    if rng.random() < 0.5:
        argv.append("--json")
    return Case("flags", tuple(argv), note="flags")


# --- matrices and audit logs -------------------------------------------------------------


@cache
def audit_lines() -> tuple[dict[str, Any], ...]:
    """Audit records of a few real decisions (the API's own, as ``--audit-log`` writes them)."""
    from moe_policy.api import Selector
    from moe_policy.reporting.audit import audit_record

    records = []
    for model, lora in (("qwen3-30b-a3b.json", False), ("deepseek-v3.json", True)):
        path = str(CONFIGS / "models" / model)
        selector = Selector(path, environ={}, platform="cuda", capability="9.0", lora=lora)
        for layer in (None, 0):
            records.append(json.loads(json.dumps(audit_record(selector.decide(layer), 1))))
    return tuple(records)


def _jsonl(records: list[Any]) -> bytes:
    return b"".join(dump_json(r).replace(b"\n", b"") + b"\n" for r in records)


def diff_case(rng: random.Random) -> Case:
    """Two audit logs (or decision records), one or both mutated, through ``diff``."""
    base = [json.loads(json.dumps(r)) for r in rng.sample(audit_lines(), rng.randint(1, 4))]
    left = _jsonl(base)
    if rng.random() < 0.5:
        right = mutate_bytes(rng, left, rng.randint(1, 4), (left,))
        note = "bytes of an audit log"
    else:
        right = _jsonl([mutate_tree(rng, r, rng.randint(1, 3)) for r in base])
        note = "tree of an audit log"
    files = {"a.jsonl": left, "b.jsonl": right}
    if rng.random() < 0.2:
        files["a.jsonl"], files["b.jsonl"] = right, left
    argv = ["diff", "a.jsonl", "b.jsonl"]
    argv += [flag for flag in ("--json", "--shared-only") if rng.random() < 0.3]
    return Case("diff", tuple(argv), files=files, note=note)


def matrix_case(rng: random.Random) -> Case:
    """The bundled deployment matrix mutated, through ``plan --matrix``."""
    base = (CONFIGS / "matrices" / "default.yaml").read_bytes()
    if rng.random() < 0.5:
        data = mutate_bytes(rng, base, rng.randint(1, 4), (base, *policy_corpus()))
        note = "bytes of the deployment matrix"
    else:
        data = dump_yaml(mutate_tree(rng, yaml.safe_load(base), rng.randint(1, 3)))
        note = "tree of the deployment matrix"
    argv = ("plan", "--matrix", "matrix.yaml", "--to", rng.choice(["strict", "prefer-trtllm-lora"]))
    return Case("matrix", argv, files={"matrix.yaml": data}, note=note)


GENERATORS: dict[str, Callable[[random.Random], Case]] = {
    "diff": diff_case,
    "matrix": matrix_case,
    "policy": policy_case,
    "model": model_case,
    "special": special_path_case,
    "env": env_case,
    "flags": flag_case,
}


def crafted_cases() -> list[Case]:
    """Every crafted policy (explain and lint), model and special path, once each."""
    cases: list[Case] = []
    rng = random.Random(0)
    env = {"MOE_POLICY_AUDIT_DIR": "{dir}"}
    for note, data in CRAFTED_POLICIES.items():
        files = {"policy.yaml": data}
        cases.append(
            Case(
                "policy",
                (
                    "explain",
                    "--model",
                    str(CONFIGS / "models" / MODEL_FILES[0]),
                    "--platform",
                    "cuda",
                    "--capability",
                    "9.0",
                    "--policy",
                    "policy.yaml",
                    "--json",
                ),
                env,
                files,
                note=f"crafted: {note}",
            )
        )
        if note not in EXPLAIN_ONLY:
            lint = Case(
                "policy", ("lint", "policy.yaml"), env, files, note=f"crafted: {note} (lint)"
            )
            cases.append(lint)
    for note, data in CRAFTED_MODELS.items():
        name = "config.yaml" if note.endswith("config.yaml") else "config.json"
        cases.append(
            Case(
                "model",
                ("explain", "--model", name, "--platform", "cuda", "--capability", "9.0"),
                {},
                {name: data},
                note=f"crafted: {note}",
            )
        )
    for note, (specials, path) in SPECIAL_PATHS.items():
        for role, argv in (
            ("policy", _explain(rng, "--policy", path)),
            ("model", ("explain", "--model", path, "--platform", "cpu")),
            ("audit", _explain(rng, "--audit-log", path)),
            ("lint", ("lint", path)),
            ("diff", ("diff", path, path)),
        ):
            cases.append(Case("special", argv, {}, {}, specials, note=f"{note} as {role}"))
    return cases

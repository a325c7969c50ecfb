"""Fuzz case generators: each takes a ``random.Random`` and returns one :class:`Case`.

The families, drawn from the shipped files so most cases are near misses of valid input:

- ``policy_case``: a shipped policy (default, profiles, the vLLM engine profile) mutated
  byte-wise or tree-wise (:mod:`tests.fuzz.mutate`), or a crafted one
  (:mod:`tests.fuzz.crafted`), through ``explain --policy``, ``lint`` or ``plan --to``;
- ``model_case``: a shipped ``config.json`` mutated the same ways, or a crafted model file;
- ``special_path_case``: a FIFO, device, directory, dangling link or overlong path as the
  policy, model, audit log or diff input;
- ``env_case``: the variables the settings read (and near misses) set to odd values;
- ``flag_case``: flags with odd values, ``--set`` items, unknown flags and commands;
- ``diff_case`` and ``matrix_case``: mutated audit logs through ``diff``, mutated
  deployment matrices through ``plan --matrix``.

The generators depend only on the ``Random`` they are given: one seed, one case list.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from functools import cache
from typing import Any

import yaml

from moe_policy.core.keys import CONTEXT_KEYS
from moe_policy.settings.env import OUR_VARIABLES, VLLM_HANDLED, VLLM_KNOWN_NO_EFFECT
from tests.bundled import REPO
from tests.fuzz.crafted import CRAFTED_MODELS, CRAFTED_POLICIES, SPECIAL_PATHS
from tests.fuzz.mutate import (
    BACKENDS,
    STRINGS,
    dump_json,
    dump_yaml,
    mutate_bytes,
    mutate_tree,
    value,
)
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
DEVICES = (
    ("cuda", "9.0", "NVIDIA H200"),
    ("cuda", "10.0", "NVIDIA B200"),
    ("cuda", "8.0", "NVIDIA A100"),
    ("rocm", None, "AMD Instinct MI300X"),
    ("cpu", None, None),
)


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
    hostile = CRAFTED_POLICIES[rng.choice(sorted(CRAFTED_POLICIES))]
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
    """Audit records of a few real decisions (the API's own, as ``--audit-log`` writes them),
    with the fields that change from run to run (time, host, pid, decision id) pinned."""
    from moe_policy.api import Selector
    from moe_policy.reporting.audit import audit_record

    pinned = {"timestamp": "2026-01-01T00:00:00.000000+00:00", "host": "fuzz", "pid": 1}
    records = []
    for model, lora in (("qwen3-30b-a3b.json", False), ("deepseek-v3.json", True)):
        path = str(CONFIGS / "models" / model)
        selector = Selector(path, environ={}, platform="cuda", capability="9.0", lora=lora)
        for layer in (None, 0):
            record = json.loads(json.dumps(audit_record(selector.decide(layer), 1)))
            record.update(pinned, decision_id=f"fuzz-{len(records)}")
            records.append(record)
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
        lint = Case("policy", ("lint", "policy.yaml"), env, files, note=f"crafted: {note} (lint)")
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

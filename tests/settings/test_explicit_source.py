"""The explicit layer (API arguments, CLI flags) and the precedence ladder as a whole."""

from __future__ import annotations

import pytest

from moe_policy.core.catalog import load_catalog
from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError
from moe_policy.settings import SOURCES, Entry, resolve_settings


def test_sources_tuple_is_the_precedence():
    """SOURCES lists the layers lowest first, as the architecture states."""
    assert [s.layer for s in SOURCES] == ["built-in", "policy file", "environment", "explicit"]


def test_explicit_beats_env_beats_file_beats_builtin(tmp_path):
    """Each layer overrides the one below and the history shows them all, in order."""
    f = tmp_path / "p.yaml"
    f.write_text("backend: flashinfer_cutlass\n")
    settings = resolve_settings(
        load_catalog(),
        policy_files=[str(f)],
        environ={"MOE_POLICY_BACKEND": "flashinfer_trtllm"},
        explicit=[Entry("backend", "triton", Origin.cli("--backend"))],
    )
    resolved = settings.values["backend"]
    assert (resolved.value, resolved.origin, resolved.layer) == (
        "triton",
        "cli:--backend",
        "explicit",
    )
    assert [(v, layer) for v, _o, layer in resolved.history] == [
        ("auto", "built-in"),
        ("flashinfer_cutlass", "policy file"),
        ("flashinfer_trtllm", "environment"),
    ]


def test_explicit_files_replace_env_files_and_say_so(tmp_path):
    """Files given explicitly replace MOE_POLICY_FILES, which is reported as ignored."""
    f = tmp_path / "p.yaml"
    f.write_text("mode: strict\n")
    settings = resolve_settings(
        load_catalog(), policy_files=[str(f)], environ={"MOE_POLICY_FILES": "/elsewhere.yaml"}
    )
    assert settings.mode == "strict"
    assert [n.name for n in settings.notices] == ["MOE_POLICY_FILES"]


def test_an_empty_list_of_files_given_explicitly_still_replaces_env_files(tmp_path):
    """`policy_files=[]` asks for no policy file: MOE_POLICY_FILES is ignored and said so."""
    f = tmp_path / "p.yaml"
    f.write_text("mode: strict\n")
    settings = resolve_settings(
        load_catalog(), policy_files=[], environ={"MOE_POLICY_FILES": str(f)}
    )
    assert settings.mode == "warn"
    assert [info.path for info in settings.files] == ["configs/default.yaml"]
    assert [n.name for n in settings.notices] == ["MOE_POLICY_FILES"]


def test_explicit_context_keys_are_validated():
    """A context key given explicitly is type-checked and keeps its origin."""
    settings = resolve_settings(
        load_catalog(), environ={}, explicit=[Entry("parallel.tp", 2, Origin.cli("--set"))]
    )
    assert (settings.context["parallel.tp"].value, settings.context["parallel.tp"].origin) == (
        2,
        "cli:--set",
    )
    with pytest.raises(PolicyError, match=r"^cli:--tp: parallel.tp: expected an integer"):
        resolve_settings(
            load_catalog(), environ={}, explicit=[Entry("parallel.tp", 2.5, Origin.cli("--tp"))]
        )


def _explicit(key, value):
    return resolve_settings(load_catalog(), environ={}, explicit=[Entry(key, value, Origin.api())])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        # typed values: the string "2" is not an integer, True is not 1, "false" not a boolean
        ("parallel.tp", "2", r"parallel.tp: expected an integer, got '2' \(a string\)"),
        ("parallel.tp", True, "parallel.tp: expected an integer, got True"),
        ("parallel.tp", [2], r"parallel.tp: expected an integer, got \[2\] \(a list\)"),
        ("parallel.tp", 10**40, "parallel.tp: integer out of range"),
        ("lora.enabled", "false", r"lora.enabled: expected a boolean .*'false' \(a string\)"),
        ("lora.enabled", 1, "lora.enabled: expected a boolean"),
        (
            "device.capability",
            "9.0000001",
            "device.capability: not a compute capability: '9.0000001'",
        ),
        ("device.capability", 99999.99999, "device.capability: not a compute capability"),
        ("device.name", {"a": 1}, r"device.name: expected a string, got \{'a': 1\} \(a dict\)"),
        ("packages", "triton", "packages: expected a list of names"),
        # the ranges a config.json value is held to
        ("model.num_experts", 0, "model.num_experts must be at least 1, got 0"),
        ("model.top_k", -1, "model.top_k must be at least 1, got -1"),
        ("model.shared_experts", -3, "model.shared_experts must be at least 0, got -3"),
        ("layer.index", -5, "layer.index must be at least 0, got -5"),
        ("lora.max_rank", 0, "lora.max_rank must be at least 1"),
        # no value is not a value
        ("parallel.tp", None, "parallel.tp: no value given"),
        # a priority list given in code names each backend once, as a policy file must
        (
            "priority.cuda",
            ["triton", "flashinfer_cutlass", "triton"],
            r"priority.cuda lists triton twice \(items 1 and 3\)$",
        ),
    ],
)
def test_explicit_values_are_typed_and_in_range(key, value, message):
    """Overrides pass the typed checks config.json values get: one error naming the key."""
    with pytest.raises(PolicyError, match=rf"^api: {message}"):
        _explicit(key, value)


def test_audit_path_empty_is_an_error_and_null_is_off():
    """An empty audit path does not switch the audit off silently; null does, explicitly."""
    with pytest.raises(PolicyError, match=r"^api: audit.path: an empty value is not a path"):
        _explicit("audit.path", "")
    assert _explicit("audit.path", None).value("audit.path") is None


def test_unknown_explicit_key_has_did_you_mean():
    """--set of an unknown key names the flag and suggests the closest key."""
    with pytest.raises(
        PolicyError,
        match=r"^cli:--set: unknown key 'lora.max_rnk' \(did you mean 'lora.max_rank'\?\)",
    ):
        resolve_settings(
            load_catalog(), environ={}, explicit=[Entry("lora.max_rnk", 8, Origin.cli("--set"))]
        )


def test_derived_keys_cannot_be_set():
    """Derived context keys are computed, never set."""
    with pytest.raises(PolicyError, match="derived"):
        resolve_settings(
            load_catalog(),
            environ={},
            explicit=[Entry("parallel.activation_format", "batched", Origin.api())],
        )

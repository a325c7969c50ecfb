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


def test_explicit_context_keys_are_validated():
    """A context key given explicitly is type-checked and keeps its origin."""
    settings = resolve_settings(
        load_catalog(), environ={}, explicit=[Entry("parallel.tp", "2", Origin.cli("--set"))]
    )
    assert (settings.context["parallel.tp"].value, settings.context["parallel.tp"].origin) == (
        2,
        "cli:--set",
    )
    with pytest.raises(PolicyError, match=r"^cli:--tp: parallel.tp: expected an integer"):
        resolve_settings(
            load_catalog(), environ={}, explicit=[Entry("parallel.tp", 2.5, Origin.cli("--tp"))]
        )


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

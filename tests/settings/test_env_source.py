"""The environment layer: our variables and the vLLM knobs users already set."""

from __future__ import annotations

import re

import pytest

from moe_policy.core.catalog import load_catalog
from moe_policy.errors import PolicyError
from moe_policy.settings import resolve_settings
from moe_policy.settings.env import EnvSource


def _settings(env):
    return resolve_settings(load_catalog(), environ=env)


def test_env_reads_os_environ_once_at_construction(monkeypatch):
    """The source snapshots os.environ when built; later changes do not leak in."""
    monkeypatch.setenv("MOE_POLICY_MODE", "strict")
    source = EnvSource()
    monkeypatch.setenv("MOE_POLICY_MODE", "warn")
    out = source.load(load_catalog())
    assert [(e.key, e.value) for e in out.settings] == [("mode", "strict")]


def test_repr_lists_relevant_variables_only():
    """The repr shows the variables the source reads, nothing else."""
    source = EnvSource({"MOE_POLICY_MODE": "warn", "HOME": "/root", "VLLM_MOE_FORCE_MARLIN": "1"})
    assert repr(source) == "EnvSource(['MOE_POLICY_MODE', 'VLLM_MOE_FORCE_MARLIN'])"


def test_env_beats_policy_files_and_keeps_origin():
    """MOE_POLICY_BACKEND sets the request with origin env:MOE_POLICY_BACKEND."""
    settings = _settings({"MOE_POLICY_BACKEND": "Triton"})
    assert settings.request is not None
    assert (settings.request.backend, settings.request.origin) == (
        "triton",
        "env:MOE_POLICY_BACKEND",
    )


def test_unknown_moe_policy_variable_is_an_error():
    """A misspelt MOE_POLICY_* variable is refused with a did-you-mean."""
    with pytest.raises(
        PolicyError,
        match=r"^env:MOE_POLICY_BACKED: unknown environment variable MOE_POLICY_BACKED \(did you mean 'MOE_POLICY_BACKEND'\?\)",
    ):
        _settings({"MOE_POLICY_BACKED": "triton"})


def test_bad_mode_value():
    """MOE_POLICY_MODE must be warn or strict."""
    with pytest.raises(
        PolicyError,
        match=re.escape(
            "env:MOE_POLICY_MODE: mode: expected one of warn, strict, got 'strct' (did you mean 'strict'?)"
        ),
    ):
        _settings({"MOE_POLICY_MODE": "strct"})


def test_bad_backend_value():
    """An unknown backend in MOE_POLICY_BACKEND names the variable."""
    with pytest.raises(
        PolicyError, match=r"^env:MOE_POLICY_BACKEND: unknown MoE backend 'flashinfer'"
    ):
        _settings({"MOE_POLICY_BACKEND": "flashinfer"})


def test_files_are_split_on_pathsep(tmp_path):
    """MOE_POLICY_FILES lists files separated by os.pathsep, in order."""
    import os

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("mode: strict\n")
    b.write_text("mode: warn\n")
    settings = _settings({"MOE_POLICY_FILES": f"{a}{os.pathsep}{b}"})
    assert settings.values["mode"].origin == f"file:{b}:1:7"
    assert [f.path for f in settings.files] == ["configs/default.yaml", str(a), str(b)]


def test_aiter_both_on_requests_aiter():
    """VLLM_ROCM_USE_AITER=1 (MOE sub-switch default on) requests aiter and switches it on."""
    settings = _settings({"VLLM_ROCM_USE_AITER": "1"})
    assert settings.request is not None and settings.request.backend == "aiter"
    assert settings.request.origin == "env:VLLM_ROCM_USE_AITER"
    assert settings.context["rocm.aiter"].value is True


def test_aiter_sub_switch_off_removes_aiter():
    """VLLM_ROCM_USE_AITER_MOE=0 switches AITER off with that variable as the origin."""
    settings = _settings({"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0"})
    assert settings.request is None
    assert (settings.context["rocm.aiter"].value, settings.context["rocm.aiter"].origin) == (
        False,
        "env:VLLM_ROCM_USE_AITER_MOE",
    )


def test_aiter_master_switch_off_names_it():
    """VLLM_ROCM_USE_AITER=0 switches AITER off whatever the MOE sub-switch says, and the
    origin names the master switch."""
    settings = _settings({"VLLM_ROCM_USE_AITER": "0", "VLLM_ROCM_USE_AITER_MOE": "1"})
    assert settings.request is None
    assert (settings.context["rocm.aiter"].value, settings.context["rocm.aiter"].origin) == (
        False,
        "env:VLLM_ROCM_USE_AITER",
    )


def test_the_aiter_moe_switch_alone_does_not_switch_aiter_on():
    """VLLM_ROCM_USE_AITER_MOE=1 without the master switch (off by default) requests nothing."""
    settings = _settings({"VLLM_ROCM_USE_AITER_MOE": "1"})
    assert settings.request is None
    assert settings.context["rocm.aiter"].value is False
    # named as what it is: the unset master switch's default, not a variable that is set
    assert str(settings.context["rocm.aiter"].origin) == (
        "derived:VLLM_ROCM_USE_AITER_MOE without VLLM_ROCM_USE_AITER (off by default)"
    )


@pytest.mark.parametrize("blank", ["", "  ", "\t"])
def test_a_blank_variable_is_ignored_with_a_notice(blank):
    """A variable set to nothing but blanks is ignored, with a notice naming it."""
    settings = _settings({"MOE_POLICY_BACKEND": blank, "MOE_POLICY_MODE": blank})
    assert settings.request is None and settings.mode == "warn"
    assert [(n.name, n.origin, n.detail) for n in settings.notices] == [
        ("MOE_POLICY_BACKEND", "env:MOE_POLICY_BACKEND", "set but empty; ignored"),
        ("MOE_POLICY_MODE", "env:MOE_POLICY_MODE", "set but empty; ignored"),
    ]


def test_batch_invariant():
    """VLLM_BATCH_INVARIANT becomes the batch_invariant fact."""
    assert _settings({"VLLM_BATCH_INVARIANT": "1"}).context["batch_invariant"].value is True
    assert _settings({"VLLM_BATCH_INVARIANT": "False"}).context["batch_invariant"].value is False
    for text in ("sometimes", "yes", "", " 2", "tru"):
        with pytest.raises(
            PolicyError, match=r"^env:VLLM_BATCH_INVARIANT: expected true, false, 1 or 0"
        ):
            _settings({"VLLM_BATCH_INVARIANT": text})


@pytest.mark.parametrize("text", ["maybe", "yes", "2", "on"])
def test_audit_required_from_the_environment_is_true_false_1_or_0(text):
    """MOE_POLICY_AUDIT_REQUIRED reads true/false/1/0 only; nothing else is a truthy yes."""
    assert _settings({"MOE_POLICY_AUDIT_REQUIRED": "1"}).value("audit.required") is True
    with pytest.raises(
        PolicyError, match=r"^env:MOE_POLICY_AUDIT_REQUIRED: audit.required: expected true"
    ):
        _settings({"MOE_POLICY_AUDIT_REQUIRED": text})


@pytest.mark.parametrize(
    "environ",
    [
        {"VLLM_USE_FLASHINFER_MOE_FP16": "1", "VLLM_FLASHINFER_MOE_BACKEND": "throughput"},
        {"VLLM_USE_FLASHINFER_MOE_FP16": "0"},
        {"VLLM_FLASHINFER_MOE_BACKEND": "latency"},
    ],
)
def test_removed_flashinfer_knobs_are_reported_and_not_acted_on(environ):
    """vLLM removed VLLM_USE_FLASHINFER_MOE_FP16 / VLLM_FLASHINFER_MOE_BACKEND: no request, no
    rule, one notice each that says so and names the replacement."""
    settings = _settings(environ)
    assert settings.request is None
    assert not [r for r in settings.rules if r.origin.startswith("env:")]
    assert sorted(n.name for n in settings.notices) == sorted(environ)
    for notice in settings.notices:
        assert "removed from vLLM" in notice.detail and "no effect" in notice.detail
        assert notice.replacement == "MOE_POLICY_BACKEND or vLLM's --moe-backend"


def test_our_variable_beats_the_vllm_request():
    """Both in the env layer: MOE_POLICY_BACKEND wins, the vLLM-derived request is in the history."""
    settings = _settings({"VLLM_ROCM_USE_AITER": "1", "MOE_POLICY_BACKEND": "triton"})
    resolved = settings.values["backend"]
    assert (resolved.value, resolved.origin) == ("triton", "env:MOE_POLICY_BACKEND")
    assert ("aiter", "env:VLLM_ROCM_USE_AITER", "environment") in resolved.history


@pytest.mark.parametrize(
    "name", ["VLLM_MOE_FORCE_MARLIN", "VLLM_FUSED_MOE_CHUNK_SIZE", "VLLM_SOME_MOE_KNOB"]
)
def test_other_vllm_moe_variables_are_reported_as_no_effect(name):
    """Any other VLLM_*MOE* variable produces a knob_ignored notice naming it."""
    settings = _settings({name: "1"})
    notice = next(n for n in settings.notices if n.name == name)
    assert notice.event == "moe_policy.knob_ignored"
    assert notice.origin == f"env:{name}"
    assert "no effect" in notice.detail


def test_the_audit_profiles_directory_variable_is_known(tmp_path, monkeypatch):
    """configs/profiles/audit.yaml reads MOE_POLICY_AUDIT_DIR; setting it is no error."""
    from moe_policy.core import paths

    for name in [n for n in __import__("os").environ if n.startswith("MOE_POLICY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MOE_POLICY_AUDIT_DIR", str(tmp_path))
    profile = str(paths.PROFILES_DIR / "audit.yaml")
    settings = resolve_settings(load_catalog(), policy_files=[profile])
    assert settings.value("audit.path") == f"{tmp_path}/moe-policy-decisions.jsonl"


@pytest.mark.parametrize(
    "name",
    [
        "MOE_POLICY_FILES",
        "MOE_POLICY_ENGINE",
        "MOE_POLICY_AUDIT_DIR",
        "MOE_POLICY_TUNED_CONFIG_DIR",
    ],
)
@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_variable_that_sets_no_key_is_ignored_with_a_notice(name, blank):
    """The variables read elsewhere (the files, the engine, the audit and tuned-file
    directories) take a blank value as unset too, and say so, as the others do."""
    settings = _settings({name: blank})
    assert [(n.name, n.origin, n.detail) for n in settings.notices] == [
        (name, f"env:{name}", "set but empty; ignored")
    ]

"""The human explain report fits a 100-column terminal for every bundled model and situation."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from moe_policy.cli.explain_text import Layout, render
from moe_policy.cli.table import fill, table, wrap
from tests.bundled import MODELS, REPO

SITUATIONS = {
    "h200-lora-request": (
        {"MOE_POLICY_BACKEND": "flashinfer_cutlass", "VLLM_MOE_FORCE_MARLIN": "1"},
        {"platform": "cuda", "capability": "9.0", "lora": True},
    ),
    "b200-deepep": (
        {},
        {
            "platform": "cuda",
            "capability": "10.0",
            "ep": True,
            "tp": 2,
            "all2all": "deepep_low_latency",
        },
    ),
    "rocm-aiter": ({"VLLM_ROCM_USE_AITER": "1"}, {"platform": "rocm"}),
}


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
@pytest.mark.parametrize("model", sorted(p.name for p in Path(MODELS).glob("*.json")))
def test_report_fits_100_columns_and_names_every_candidate(
    make_selector, monkeypatch, model, situation
):
    """Every line <= 100 columns; every backend and every rule id appears."""
    monkeypatch.chdir(REPO)  # repository-relative paths, as a user in the checkout types them
    environ, arguments = SITUATIONS[situation]
    path = str(Path(MODELS, model).relative_to(REPO))
    selector = make_selector(
        path,
        environ=environ,
        policy_files=["configs/profiles/prefer-trtllm-lora.yaml"],
        **arguments,
    )
    text = render(selector.explain(), path)
    assert max(len(line) for line in text.splitlines()) <= 100
    decision = selector.decide()
    for name in [c.backend for c in decision.candidates] + [r.id for r in decision.rules]:
        assert name in text


def test_wrap_keeps_continuations_of_indented_lines_indented():
    """A wrapped `beat` line continues under itself, plain text wraps flush."""
    assert (
        wrap("  beat strict (file:configs/profiles/strict.yaml:5:7)", 20)
        .splitlines()[1]
        .startswith("    ")
    )
    assert wrap("one two three four", 9) == "one two\nthree\nfour"


def test_table_marks_empty_cells():
    """None and empty strings render as '-' so columns never look shifted."""
    assert table([("a", None, "")], ("x", "y", "z")).splitlines()[-1].split() == ["a", "-", "-"]


def _words(text: str) -> Counter[str]:
    """Words cut after each '/' (where a path may wrap), without table rules and dashes."""
    pieces = (p for word in text.split() for p in re.findall(r"[^/]*/+|[^/]+", word))
    return Counter(p for p in pieces if not re.fullmatch(r"[-=]+", p))


@pytest.mark.parametrize("width", [60, 80, 160])
@pytest.mark.parametrize("situation", sorted(SITUATIONS))
@pytest.mark.parametrize("model", sorted(p.name for p in Path(MODELS).glob("*.json")))
def test_report_wraps_only_between_words_at_any_width(
    make_selector, monkeypatch, model, situation, width
):
    """At 60, 80 and 160 columns the report has exactly the words of the unwrapped one (no
    identifier or path piece split); at 80 and 160 every line fits."""
    monkeypatch.chdir(REPO)
    environ, arguments = SITUATIONS[situation]
    path = str(Path(MODELS, model).relative_to(REPO))
    selector = make_selector(
        path,
        environ=environ,
        policy_files=["configs/profiles/prefer-trtllm-lora.yaml"],
        **arguments,
    )
    explanation = selector.explain()
    text = render(explanation, path, Layout(width=width))
    assert _words(text) == _words(render(explanation, path, Layout(width=100_000)))
    if width >= 80:  # at 60, a row of long codes (device_capability_unsupported) overflows
        assert max(len(line) for line in text.splitlines()) <= width


def test_wrap_never_cuts_an_identifier_and_cuts_a_long_path_after_a_slash():
    """A word wider than the column overflows it; a path wider than it breaks after '/'."""
    assert wrap("key device.capability", 8).splitlines() == ["key", "device.capability"]
    assert wrap("file:/a/bb/ccc/dddd.yaml:1:2", 12).splitlines() == [
        "file:/a/bb/",
        "ccc/",
        "dddd.yaml:1:2",
    ]


def test_verbose_report_shows_whole_hashes(make_selector, monkeypatch):
    """-v's layout prints the whole fingerprint and policy sha256; the default their prefixes."""
    monkeypatch.chdir(REPO)
    selector = make_selector(str(Path(MODELS, "qwen3-30b-a3b.json").relative_to(REPO)))
    explanation = selector.explain()
    digest = explanation.settings.files[0].sha256
    fingerprint = explanation.decision.fingerprint
    verbose = render(explanation, "m", Layout(verbose=True))
    default = render(explanation, "m")
    assert digest in verbose and fingerprint in verbose
    assert digest not in default and fingerprint not in default
    assert digest[:12] in default and fingerprint[:16] in default


def test_fill_keeps_the_spacing_written_and_breaks_a_long_path_after_a_slash():
    """Aligned labels keep their spaces; a path wider than the line continues after a '/'."""
    assert fill("mode:        warn", 40, indent=13) == "mode:        warn"
    assert fill(
        "model: /checkpoints/qwen3/Qwen3-30B-A3B/config.json", 30, indent=2
    ).splitlines() == [
        "model: /checkpoints/qwen3/",
        "  Qwen3-30B-A3B/config.json",
    ]

"""The built-in layer: configs/default.yaml."""

from __future__ import annotations

from omegaconf import OmegaConf

from moe_policy.core.catalog import load_catalog
from moe_policy.core.paths import DEFAULT_POLICY
from moe_policy.settings import resolve_settings
from moe_policy.settings.builtin import BuiltinSource


def test_builtin_values_carry_default_yaml_positions():
    """Every built-in setting's origin is file:configs/default.yaml:LINE:COL of its value."""
    settings = resolve_settings(load_catalog(), environ={})
    mode = settings.values["mode"]
    assert (mode.value, mode.layer) == ("warn", "built-in")
    line = int(mode.origin.split(":")[2])
    assert DEFAULT_POLICY.read_text().splitlines()[line - 1].startswith("mode: warn")


def test_bounded_loader_and_omegaconf_read_default_yaml_identically():
    """The bounded loader reads the built-in policy exactly as OmegaConf does."""
    from moe_policy.core.yamlio import load_yaml_file

    fast = load_yaml_file(DEFAULT_POLICY).data
    slow = OmegaConf.to_container(OmegaConf.load(DEFAULT_POLICY), resolve=True)
    assert fast == slow


def test_repr_names_the_file():
    """The source's repr shows its configuration."""
    assert repr(BuiltinSource()) == "BuiltinSource('configs/default.yaml')"

"""The hardware and package probe: run once, frozen, replaceable for dry runs and tests.

The probe never imports torch: it reads the device through torch only when the
engine has already imported it, otherwise through ``nvidia-smi`` / ``rocm-smi``.
Packages are found with ``importlib.util.find_spec`` (no import). A probe step that
fails counts as "absent" and is reported as a notice, never as a crash.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from moe_policy.core.state import STATE
from moe_policy.core.values import capability_from_text

#: Packages the catalog may require; probed on the local machine.
KNOWN_PACKAGES = ("torch", "triton", "flashinfer", "aiter", "vllm", "deep_ep")


@dataclass(frozen=True)
class PlatformFacts:
    """What the target machine is and has. ``packages=None`` means "assume every package"."""

    platform: str
    capability: str | None = None
    device_name: str | None = None
    packages: tuple[str, ...] | None = None
    origin: str = "probe"
    problems: tuple[str, ...] = field(default=(), compare=False)


def _probe_packages() -> tuple[str, ...]:
    found = []
    for name in KNOWN_PACKAGES:
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except (ImportError, ValueError):
            continue
    return tuple(sorted(found))


def _probe_torch_device() -> tuple[str, str | None, str | None] | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        platform = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        return platform, f"{major}.{minor}", torch.cuda.get_device_name()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu", None, xpu.get_device_name()
    return "cpu", None, None


def _probe_nvidia_smi() -> tuple[str, str | None, str | None] | None:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = (
        subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        .stdout.strip()
        .splitlines()
    )
    if not out:
        return None
    name, cap = (part.strip() for part in out[0].split(",", 1))
    return "cuda", cap, name


def probe() -> PlatformFacts:
    """Probe the local machine (uncached; use ``current_platform``)."""
    problems: list[str] = []
    packages = _probe_packages()
    for step in (_probe_torch_device, _probe_nvidia_smi):
        try:
            found = step()
        except Exception as exc:  # a broken probe is "absent", reported, never fatal
            problems.append(f"{step.__name__}: {type(exc).__name__}: {exc}")
            continue
        if found is not None:
            platform, cap, name = found
            if cap is not None:
                try:
                    cap = capability_from_text(cap)
                except ValueError as exc:  # e.g. nvidia-smi's "[N/A]": unknown, reported
                    problems.append(f"{step.__name__}: {exc}")
                    cap = None
            return PlatformFacts(platform, cap, name, packages, "probe", tuple(problems))
    import shutil

    if shutil.which("rocm-smi") is not None:
        return PlatformFacts("rocm", None, None, packages, "probe", tuple(problems))
    return PlatformFacts("cpu", None, None, packages, "probe", tuple(problems))


def probed_platform() -> PlatformFacts:
    """This machine's facts, probed once per process; a pinned platform plays no part."""
    if STATE.probed_platform is None:
        STATE.probed_platform = probe()
    return STATE.probed_platform


def current_platform() -> PlatformFacts:
    """The pinned platform if any, else the probed one (probed once per process)."""
    if STATE.pinned_platform is not None:
        return STATE.pinned_platform
    return probed_platform()


@contextlib.contextmanager
def override_platform(facts: PlatformFacts) -> Iterator[PlatformFacts]:
    """Pin the platform for the duration of a block (tests, dry runs).

    The pin is process-wide: selections made by other threads while the block runs see it
    too. For a platform of one selector's own, pass ``Selector(..., platform=facts)``.
    """
    previous = STATE.pinned_platform
    STATE.pinned_platform = facts
    try:
        yield facts
    finally:
        STATE.pinned_platform = previous

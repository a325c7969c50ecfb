"""Errors and warnings of moe_policy. Every message names where the bad value came from."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moe_policy.core.decision import Decision, Override


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a choice that differs only in case, else the closest one,
    or an empty string.

    >>> did_you_mean("flashinfer_cutlas", ["triton", "flashinfer_cutlass"])
    " (did you mean 'flashinfer_cutlass'?)"
    >>> did_you_mean("Sigmoid", ["softmax", "sigmoid"])
    " (did you mean 'sigmoid'?)"
    """
    import difflib

    choices = list(choices)
    same = [c for c in choices if str(c).lower() == str(value).lower()]
    close = same or difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class MoEPolicyError(Exception):
    """Base class of every error raised by moe_policy."""


class PolicyError(MoEPolicyError, ValueError):
    """Bad input: policy file, env var, flag, API argument or model config; names its origin."""

    def __init__(
        self, message: str, origin: Any = None, key: str | None = None, code: str = "invalid-value"
    ) -> None:
        self.origin = str(origin) if origin is not None else None
        self.key = key
        #: The message without its origin prefix.
        self.message = message
        #: A finding code for ``moe-policy lint`` (``unknown-key``, ``malformed-yaml``, ...).
        self.code = code
        prefix = f"{self.origin}: " if self.origin else ""
        super().__init__(prefix + message)


class NoFeasibleBackendError(MoEPolicyError, RuntimeError):
    """No backend can run this layer; the message lists every backend with its reason."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        platform = decision.context.get("platform", ("?", ""))[0]
        request_only = [c.backend for c in decision.candidates if c.reason_code is None]
        head = f"no MoE backend can run this layer ({decision.layer_label()})"
        if request_only:
            head = (
                f"no backend of the {platform} priority list can run this layer "
                f"({decision.layer_label()}); feasible on request only: {', '.join(request_only)}"
            )
        lines = [head + ":"]
        for cand in decision.candidates:
            if cand.reason_code is None:
                continue
            rule = f" [rule {cand.rule}]" if cand.rule else ""
            lines.append(f"  - {cand.backend}: {cand.reason_code.value} ({cand.detail}){rule}")
        super().__init__("\n".join(lines))


class BackendOverrideError(MoEPolicyError, RuntimeError):
    """Strict mode: an explicit backend request cannot be honoured."""

    def __init__(self, decision: Decision, override: Override) -> None:
        self.decision = decision
        self.override = override
        mode_origin = decision.run_settings.get("mode", (None, None))[1]
        where = f"set by {mode_origin}; " if mode_origin else ""
        super().__init__(
            f"requested MoE backend {override.requested!r} (from {override.origin}) cannot be "
            f"used: {override.reason_code.value}: {override.detail}; the policy would select "
            f"{override.selected!r} instead, but mode is strict "
            f"({where}mode: warn in a layer that beats it accepts the fallback)"
        )


class BackendOverrideWarning(UserWarning):
    """An explicit backend request was overridden (warn mode).

    Filter it like any warning: ``-W error::moe_policy.BackendOverrideWarning``.
    """

    def __init__(self, override: Override) -> None:
        self.override = override
        super().__init__(
            f"requested MoE backend {override.requested!r} (from {override.origin}) was "
            f"overridden by {override.selected!r}: {override.reason_code.value}: {override.detail}"
        )

"""``moe-policy explain``: decide like a real selection and show why.

Every flag becomes an explicit entry whose origin is ``cli:--flag``; ``--set
key=value`` sets any context or settings key (origin ``cli:--set``, the value read as
the key's type, applied after the named flags). The decision is then
reported exactly as an engine's ``Selector.select`` would: events on stderr,
the audit line, a refusal in strict mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from moe_policy.cli.logsetup import LOG_FORMATS
from moe_policy.core.keys import PLATFORMS
from moe_policy.core.origin import Origin
from moe_policy.core.values import capability_from_text, int_from_text
from moe_policy.errors import BackendOverrideWarning, PolicyError, did_you_mean
from moe_policy.settings import Entry


def typed(key: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` for ``key``: ``parse`` (``moe_policy.core.values``) or a usage
    error naming the key; the range checks come later, where API values get them too."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{key}: {exc}") from None

    return convert


#: Flags that set one key each: (flag, key, argparse options). The flag is the origin.
FLAG_KEYS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--backend", "backend", {"metavar": "NAME", "help": "explicit backend request (or auto)"}),
    ("--mode", "mode", {"metavar": "warn|strict", "help": "strict: refuse an infeasible request"}),
    (
        "--lora",
        "lora.enabled",
        {"action": "store_const", "const": True, "help": "LoRA adapters are served"},
    ),
    (
        "--max-lora-rank",
        "lora.max_rank",
        {
            "type": typed("lora.max_rank", int_from_text),
            "metavar": "N",
            "help": "largest adapter rank",
        },
    ),
    (
        "--max-loras",
        "lora.max_loras",
        {
            "type": typed("lora.max_loras", int_from_text),
            "metavar": "N",
            "help": "adapter slots per batch",
        },
    ),
    (
        "--platform",
        "platform",
        {"metavar": "|".join(PLATFORMS), "help": "dry run for this platform"},
    ),
    (
        "--capability",
        "device.capability",
        {
            "type": typed("device.capability", capability_from_text),
            "metavar": "X.Y",
            "help": "compute capability, cuda or rocm (dry run)",
        },
    ),
    ("--device-name", "device.name", {"metavar": "NAME", "help": "device name (dry run)"}),
    ("--dtype", "model.dtype", {"metavar": "bf16|fp16|fp32", "help": "override the model's dtype"}),
    (
        "--tp",
        "parallel.tp",
        {
            "type": typed("parallel.tp", int_from_text),
            "metavar": "N",
            "help": "tensor-parallel size",
        },
    ),
    (
        "--dp",
        "parallel.dp",
        {"type": typed("parallel.dp", int_from_text), "metavar": "N", "help": "data-parallel size"},
    ),
    ("--ep", "parallel.ep", {"action": "store_const", "const": True, "help": "expert parallelism"}),
    (
        "--all2all",
        "parallel.all2all",
        {"metavar": "NAME", "help": "all2all kind, e.g. deepep_low_latency"},
    ),
    (
        "--eplb",
        "parallel.eplb",
        {"action": "store_const", "const": True, "help": "expert load balancing"},
    ),
    ("--layer-kind", "layer.kind", {"metavar": "KIND", "help": "moe, draft, mtp or shared"}),
    (
        "--audit-log",
        "audit.path",
        {"metavar": "PATH", "help": "append the decision to this JSON-lines file"},
    ),
)


EXAMPLES = """examples:
  moe-policy explain --model qwen3-30b-a3b --platform cuda --capability 9.0 --lora
  moe-policy explain --model /models/Qwen3-30B-A3B --tp 2 --ep --profile strict
  moe-policy explain --model config.json --set parallel.tp=2 --json > decision.json
  MOE_POLICY_BACKEND=flashinfer_cutlass moe-policy explain --model qwen3-30b-a3b -q

exit codes: 0 decided, 2 bad input, 3 refused in strict mode, 4 no feasible backend
(moe-policy --help lists the environment variables)"""


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``explain`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "explain",
        help="decide the backend of one MoE layer and explain why",
        description="Decide the MoE backend like a real selection and show the settings\n"
        "ladder, the context, every candidate, the rules and what strict mode would do.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="PATH|DIR|NAME",
        help="a config.json (or YAML), a Hugging Face model directory, or a bundled model "
        "name (e.g. qwen3-30b-a3b)",
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME",
        help="a bundled policy profile (strict, audit, prefer-trtllm-lora); repeatable, "
        "read before the --policy files",
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="PATH",
        help="policy file (repeatable, later wins; replaces MOE_POLICY_FILES)",
    )
    parser.add_argument(
        "--engine",
        default=None,
        metavar="NAME[==VERSION]",
        help="the engine the decision is for: moe_policy (default) or vllm, vllm==0.33 "
        "(its backends, experts classes and rules; needs no engine installed)",
    )
    for flag, _key, options in FLAG_KEYS:
        parser.add_argument(flag, dest=_dest(flag), default=None, **options)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any context or settings key, e.g. parallel.tp=2 or packages=[triton,torch]",
    )
    parser.add_argument("--json", action="store_true", help="print the decision record (JSON)")
    parser.add_argument(
        "-q",
        "--quiet",
        dest="verbosity",
        action="store_const",
        const=-1,
        default=0,
        help="print the decision line only; stderr events at warning and above",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="store_const",
        const=1,
        help="more detail (whole hashes and fingerprint, experts classes) and every event, "
        "debug ones too, even where the report already shows it",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help="stderr events: console (default on a terminal) or JSON lines",
    )
    return parser


def flag_entries(args: argparse.Namespace) -> list[Entry]:
    """One explicit entry per given flag, origin ``cli:--flag``; an empty or blank
    ``--device-name`` is refused, as an empty ``--audit-log`` is."""
    if args.device_name is not None and not args.device_name.strip():
        raise PolicyError(
            "device.name: an empty value is not a device name (give the name the driver "
            "reports, e.g. 'NVIDIA H200')",
            Origin.cli("--device-name"),
            key="device.name",
        )
    return [
        Entry(key, getattr(args, _dest(flag)), Origin.cli(flag))
        for flag, key, _options in FLAG_KEYS
        if getattr(args, _dest(flag)) is not None
    ]


def set_entries(items: Sequence[str]) -> list[Entry]:
    """``--set key=value`` items as explicit entries, each value read as its key's type."""
    from moe_policy.settings.explicit import set_entry

    return [set_entry(item, Origin.cli("--set")) for item in items]


def _report(selector: Any, decision: Any) -> None:
    """Report like ``Selector.select``; the override warning is already an event on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            selector.reporter.report(decision, selector.audit)
        finally:
            for item in caught:
                if not issubclass(item.category, BackendOverrideWarning):
                    warnings.showwarning(item.message, item.category, item.filename, item.lineno)


def _print(explanation: Any, args: argparse.Namespace) -> None:
    if args.json:
        sys.stdout.write(json.dumps(explanation.decision.to_dict(), indent=2) + "\n")
    else:
        from moe_policy.cli.explain_text import Layout, decision_line, render
        from moe_policy.cli.terminal import output_width, style_for

        style = style_for(getattr(args, "color", None), sys.stdout)
        if args.verbosity < 0:
            sys.stdout.write(decision_line(explanation.decision, style) + "\n")
        else:
            layout = Layout(output_width(sys.stdout), style, verbose=args.verbosity > 0)
            sys.stdout.write(render(explanation, args.model, layout))
    sys.stdout.flush()


def profile_path(name: str) -> Path:
    """The bundled profile ``name`` (``configs/profiles/<name>.yaml``), or an error listing them."""
    from moe_policy.core import paths

    profiles = paths.bundled(paths.PROFILES_DIR, ".yaml")
    if name not in profiles:
        raise PolicyError(
            f"unknown profile {name!r}{did_you_mean(name, profiles)}; bundled: {', '.join(profiles)}",
            Origin.cli("--profile"),
        )
    return profiles[name]


def model_arg(spec: str) -> str:
    """``--model``, refused when empty (``Path("")`` is the current directory)."""
    if not spec.strip():
        raise PolicyError(
            "an empty value is not a model (give a config.json, a model directory or a "
            "bundled model's name)",
            Origin.cli("--model"),
        )
    return spec


#: The platforms whose devices have a compute capability: CUDA's, and ROCm's (torch reports
#: a gfx942 as 9.4, and the probe records it); elsewhere it would be ignored.
CAPABILITY_PLATFORMS = ("cuda", "rocm")


def check_capability_platform(context: Any) -> None:
    """A compute capability given for a platform that has none is an error naming both."""
    capability, platform = context.values.get("device.capability"), context.values.get("platform")
    if capability is None or platform in CAPABILITY_PLATFORMS:
        return
    raise PolicyError(
        f"device.capability {capability} is given for platform {platform} "
        f"({context.origins.get('platform')}), which has no compute capability (only "
        f"{' and '.join(CAPABILITY_PLATFORMS)} devices have one); leave it out",
        context.origins.get("device.capability"),
        key="device.capability",
    )


def run(args: argparse.Namespace) -> int:
    """Resolve, print (human or JSON), then report; exceptions carry the exit code."""
    from moe_policy.api import Selector
    from moe_policy.reporting.audit import AuditWriteError

    entries = [*flag_entries(args), *set_entries(args.set)]
    profiles = [str(profile_path(name)) for name in args.profile]
    files = [*profiles, *(args.policy or [])] if (profiles or args.policy) else None
    selector = Selector(
        model_arg(args.model),
        policy_files=files,
        explicit=entries,
        files_origin=Origin.cli("--policy" if args.policy else "--profile"),
        engine=args.engine,
        engine_origin=Origin.cli("--engine"),
    )
    check_capability_platform(selector.context)
    explanation = selector.explain()
    try:
        _print(explanation, args)
    except BrokenPipeError:  # the reader left (`| head`); still report and exit with the real code
        from moe_policy.cli.app import silence_stdout

        silence_stdout()
    try:
        _report(selector, explanation.decision)
    except AuditWriteError as exc:
        resolved = selector.settings.values.get("audit.path")
        raise PolicyError(str(exc), resolved.origin if resolved else None) from None
    return 0

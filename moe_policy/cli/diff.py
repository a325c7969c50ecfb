"""``moe-policy diff A B``: what differs between two audit logs or two decision records, per layer.

Inputs are JSON-lines audit logs (decision records plus timestamp, host, pid, rank,
count; ``kind: "agreement"`` lines are skipped, and so are torn lines, the start of a record
whose write was cut short, each named on stderr) or single decision records
(``explain --json``). Layers are matched by signature ``(layer.kind, layer.index)``;
two files holding one record each are compared directly. Per layer it prints the
backend, fingerprint, every context key whose value differs (each side's value and
origin), the request and its origin, the policy file hashes and the rules that
differ, fitted to the terminal's width. Exit codes: 0 identical, 1 different, 2 bad
input (names ``file:PATH:LINE``; a line whose fields ``diff`` reads have the wrong types
is bad input too).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moe_policy.core.canonical import canonical_json
from moe_policy.core.textfile import decode_utf8
from moe_policy.errors import PolicyError
from moe_policy.fleet.agreement import RANK_LOCAL_KEYS, compress, format_layers

EXIT_IDENTICAL = 0
EXIT_DIFFERENT = 1
EXIT_BAD_INPUT = 2
#: Top-level record fields compared as plain values, in print order.
FIELDS = (
    "backend",
    "experts_class",
    "activation_format",
    "outcome",
    "fingerprint",
    "mode",
    "library_version",
)
REQUIRED = ("schema_version", "fingerprint", "backend", "context", "layer")

Signature = tuple[str, "int | None"]


class DiffInputError(Exception):
    """A file that cannot be read or a line that is not a decision record (``file:line``)."""


@dataclass
class Variant:
    """One distinct decision (by fingerprint and backend) for a layer in one file."""

    record: Mapping[str, Any]
    lines: int = 0
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.record.get("fingerprint"),
            "backend": self.record.get("backend"),
            "records": self.lines,
            "ranks": sorted(self.ranks),
            "hosts": sorted(self.hosts),
        }


@dataclass
class Loaded:
    """A file's decision records grouped by layer signature, then by variant."""

    path: str
    layers: dict[Signature, dict[str, Variant]] = field(default_factory=dict)
    records: int = 0
    skipped: int = 0
    #: Line numbers of torn lines: the start of a record whose write was cut short.
    torn: list[int] = field(default_factory=list)

    def add(self, record: Mapping[str, Any]) -> None:
        layer = record["layer"]
        sig = (str(layer.get("kind") or "moe"), layer.get("index"))
        key = f"{record.get('fingerprint')}/{record.get('backend')}"
        variant = self.layers.setdefault(sig, {}).setdefault(key, Variant(record))
        variant.record = record
        variant.lines += 1
        if isinstance(record.get("rank"), int):
            variant.ranks.add(record["rank"])
        if record.get("host"):
            variant.hosts.add(str(record["host"]))
        self.records += 1

    def primary(self, sig: Signature) -> Variant:
        """The variant with most records (the first seen on a tie)."""
        return max(self.layers[sig].values(), key=lambda v: v.lines)

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "records": self.records,
            "skipped": self.skipped,
            "torn_lines": list(self.torn),
            "layers": len(self.layers),
        }

    def report_torn(self) -> None:
        """Log ``moe_policy.diff_torn_lines`` (warning) when torn lines were skipped: on a
        terminal a line for people, otherwise a JSON event, as every event of the CLI."""
        if not self.torn:
            return
        from moe_policy.reporting.events import get_logger

        get_logger().warning(
            "moe_policy.diff_torn_lines",
            path=self.path,
            lines=list(self.torn),
            detail=f"skipped {len(self.torn)} torn line{'s' if len(self.torn) > 1 else ''}: "
            "the start of a record whose write was cut short (a full disk, a size limit, a "
            "writer killed mid-record)",
        )


# --- Loading --------------------------------------------------------------------------------


def _read(path: str) -> str:
    """The file's text; a FIFO, device or directory is refused without waiting on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise DiffInputError(f"file:{path}: cannot read: {exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DiffInputError(f"file:{path}: cannot read: not a regular file")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read()
        except OSError as exc:
            raise DiffInputError(f"file:{path}: cannot read: {exc}") from None
    try:
        return decode_utf8(data, path)
    except PolicyError as exc:  # file:PATH:LINE:COL of the first bad byte
        raise DiffInputError(str(exc)) from None


def _json(text: str) -> Any:
    """``json.loads``; every failure (syntax, a 5,000-digit integer, deep nesting) a ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def load(path: str) -> Loaded:
    """Read one file: a JSON document (a record or a list of records) or JSON lines."""
    text = _read(path)
    loaded = Loaded(path)
    stripped = text.strip()
    document: Any = None
    if stripped[:1] in ("{", "["):
        try:
            document = _json(stripped)
        except ValueError:
            document = None
    if isinstance(document, dict):
        _take(loaded, document, f"file:{path}:1")
        return loaded
    if isinstance(document, list):
        for number, item in enumerate(document, 1):
            _take(loaded, item, f"file:{path}: item {number}")
        return loaded
    lines = text.split("\n")
    if _multi_line_document(lines):  # a JSON document over several lines that does not parse
        try:
            _json(stripped)
        except json.JSONDecodeError as exc:
            raise DiffInputError(
                f"file:{path}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})"
            ) from None
        except ValueError as exc:
            reason = str(exc).split(";")[0]
            raise DiffInputError(f"file:{path}: not JSON ({reason})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = _json(line)
        except json.JSONDecodeError as exc:
            if line.startswith("{"):  # the start of a record whose write was cut short
                loaded.torn.append(number)
                continue
            raise DiffInputError(
                f"file:{path}:{number}:{exc.colno}: not JSON ({exc.msg})"
            ) from None
        except ValueError as exc:  # a 5,000-digit integer, nesting too deep
            reason = str(exc).split(";")[0]
            raise DiffInputError(f"file:{path}:{number}: not JSON ({reason})") from None
        _take(loaded, item, f"file:{path}:{number}")
    return loaded


def _multi_line_document(lines: list[str]) -> bool:
    """Whether the text is one JSON document over several lines (``explain --json``): its
    first line opens it alone and no later line starts a record, as in a JSON-lines log."""
    filled = [line for line in lines if line.strip()]
    return (
        len(filled) > 1
        and filled[0].strip() in ("{", "[")
        and not any(line.startswith("{") for line in filled[1:])
    )


def _take(loaded: Loaded, item: Any, where: str) -> None:
    if isinstance(item, dict) and item.get("kind") == "agreement":
        loaded.skipped += 1
        return
    if not isinstance(item, dict):
        raise DiffInputError(f"{where}: not a decision record (a JSON {type(item).__name__})")
    missing = [key for key in REQUIRED if key not in item]
    what = f"missing {', '.join(missing)}" if missing else _shape_problem(item)
    if what:
        raise DiffInputError(f"{where}: not a decision record ({what})")
    loaded.add(item)


def _is_list_of(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(v, kind) for v in value))


def _shape_problem(item: Mapping[str, Any]) -> str | None:
    """What is wrong with the types of the fields ``diff`` reads, if anything."""
    layer, context = item["layer"], item["context"]
    if not isinstance(context, dict) or not isinstance(layer, dict):
        return "context and layer must be objects"
    index = layer.get("index")
    if not isinstance(layer.get("kind"), (str, type(None))) or not (
        index is None or (isinstance(index, int) and not isinstance(index, bool))
    ):
        return "layer.kind must be a string and layer.index an integer or null"
    if not all(isinstance(v, (dict, type(None))) for v in context.values()):
        return "each context entry must be an object"
    if not isinstance(item.get("requested"), (dict, type(None))):
        return "requested must be an object or null"
    policy = item.get("policy")
    if not isinstance(policy, (dict, type(None))) or not _is_list_of(
        (policy or {}).get("files"), dict
    ):
        return "policy must be an object whose files are objects"
    rules = item.get("rules")
    if not _is_list_of(rules, dict) or not all(
        _is_list_of(rule.get("backends"), str) for rule in rules or []
    ):
        return "rules must be objects whose backends are strings"
    return None


# --- Comparing ------------------------------------------------------------------------------


def diff_records(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """What differs between two decision records (empty when nothing does)."""
    out: dict[str, Any] = {}
    if a.get("layer") != b.get("layer"):
        out["layer"] = {"a": a.get("layer"), "b": b.get("layer")}
    for name in FIELDS:
        if a.get(name) != b.get(name):
            out[name] = {"a": a.get(name), "b": b.get(name)}
    ctx_a, ctx_b = a.get("context", {}), b.get("context", {})
    context = {
        key: {"a": ctx_a.get(key), "b": ctx_b.get(key)}
        for key in sorted(set(ctx_a) | set(ctx_b))
        if key not in RANK_LOCAL_KEYS
        and canonical_json((ctx_a.get(key) or {}).get("value"))
        != canonical_json((ctx_b.get(key) or {}).get("value"))
    }
    if context:
        out["context"] = context
    req_a, req_b = _request(a), _request(b)
    if req_a != req_b:
        out["request"] = {"a": req_a, "b": req_b}
    files_a, files_b = _files(a), _files(b)
    if [f["sha256"] for f in files_a] != [f["sha256"] for f in files_b]:
        out["policy_files"] = {"a": files_a, "b": files_b}
    rules_a, rules_b = _rules(a), _rules(b)
    rules = {
        rule_id: {"a": rules_a.get(rule_id), "b": rules_b.get(rule_id)}
        for rule_id in sorted(set(rules_a) | set(rules_b))
        if _rule_key(rules_a.get(rule_id)) != _rule_key(rules_b.get(rule_id))
    }
    if rules:
        out["rules"] = rules
    return out


def _request(record: Mapping[str, Any]) -> dict[str, Any] | None:
    req = record.get("requested")
    return None if not req else {"backend": req.get("backend"), "origin": req.get("origin")}


def _files(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    files = (record.get("policy") or {}).get("files") or []
    return [{"path": f.get("path"), "sha256": f.get("sha256")} for f in files]


def _rules(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    keep = ("effect", "action", "backends", "matched", "applied", "origin")
    return {str(r.get("id")): {k: r.get(k) for k in keep} for r in record.get("rules") or []}


def _rule_key(rule: Mapping[str, Any] | None) -> Any:
    return (
        None
        if rule is None
        else [rule.get(k) for k in ("effect", "action", "backends", "matched", "applied")]
    )


def compare(a: Loaded, b: Loaded, *, shared_only: bool = False) -> dict[str, Any]:
    """The machine-readable comparison (``--json``); ``identical`` says whether anything differs."""
    groups: dict[str, dict[str, Any]] = {}
    same: list[Signature] = []
    pairs: list[tuple[Signature, Signature]]
    if a.records == 1 and b.records == 1:
        pairs = [(next(iter(a.layers)), next(iter(b.layers)))]
    else:
        pairs = [(sig, sig) for sig in sorted(set(a.layers) & set(b.layers), key=_order)]
    for sig_a, sig_b in pairs:
        diff = diff_records(a.primary(sig_a).record, b.primary(sig_b).record)
        variants = _variants(a, sig_a, b, sig_b)
        if variants:
            diff["variants"] = variants
        if not diff:
            same.append(sig_a)
            continue
        entry = groups.setdefault(canonical_json(diff), {"layers": [], "differences": diff})
        entry["layers"].append(list(sig_a))
    paired_a = {p[0] for p in pairs}
    paired_b = {p[1] for p in pairs}
    only_a = [] if shared_only else sorted(set(a.layers) - paired_a, key=_order)
    only_b = [] if shared_only else sorted(set(b.layers) - paired_b, key=_order)
    return {
        "identical": not groups and not only_a and not only_b,
        "a": a.summary(),
        "b": b.summary(),
        "differences": list(groups.values()),
        "only_in_a": [list(s) for s in only_a],
        "only_in_b": [list(s) for s in only_b],
        "identical_layers": [list(s) for s in same],
    }


def _variants(a: Loaded, sig_a: Signature, b: Loaded, sig_b: Signature) -> dict[str, Any] | None:
    va, vb = a.layers[sig_a], b.layers[sig_b]
    if (len(va) == 1 and len(vb) == 1) or set(va) == set(vb):
        return None
    return {"a": [v.to_dict() for v in va.values()], "b": [v.to_dict() for v in vb.values()]}


def _order(sig: Signature) -> tuple[str, int]:
    return sig[0], -1 if sig[1] is None else int(sig[1])


# --- Printing ---------------------------------------------------------------------------------


def _value(item: Any) -> str:
    if item is None:
        return "absent"
    if isinstance(item, Mapping) and "value" in item:
        value = item["value"]
        text = "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)
        return f"{text} ({item.get('origin')})"
    if isinstance(item, Mapping) and "backend" in item and "origin" in item:
        return f"{item['backend']} ({item['origin']})"
    return str(item)


def render(result: Mapping[str, Any], width: int | None = None) -> str:
    """The human-readable report for ``width`` columns (None: unwrapped): a line that does
    not fit wraps at spaces (a path or identifier is never split), and a difference whose
    two sides do not fit one line puts each side on a line of its own under the name."""
    text = _report(result)
    if width is None:
        return text
    from moe_policy.cli.lines import fit

    out = []
    for line in text.splitlines():
        name, sep, sides = line.partition(": A ")
        side_a, bar, side_b = sides.partition(" | B ")
        if len(line) > width and line.startswith("  ") and sep and bar:
            out.append(f"{name}:")
            out.extend(
                fit(f"    {side} {value}", width) for side, value in (("A", side_a), ("B", side_b))
            )
        else:
            out.append(fit(line, width))
    return "\n".join(out)


def _report(result: Mapping[str, Any]) -> str:
    a, b = result["a"], result["b"]
    lines = [
        f"A: {a['path']} ({a['records']} records, {a['layers']} layers)",
        f"B: {b['path']} ({b['records']} records, {b['layers']} layers)",
    ]
    for group in result["differences"]:
        sigs = [(str(s[0]), s[1]) for s in group["layers"]]
        lines.append(f"{format_layers(sigs)} differ:")
        lines.extend(_difference_lines(group["differences"]))
    for side in ("a", "b"):
        only = result[f"only_in_{side}"]
        if only:
            lines.append(
                f"only in {side.upper()}: {format_layers([(str(s[0]), s[1]) for s in only])}"
            )
    if result["identical_layers"]:
        lines.append(
            f"identical: {format_layers([(str(s[0]), s[1]) for s in result['identical_layers']])}"
        )
    lines.append("identical" if result["identical"] else "different")
    return "\n".join(lines)


def _difference_lines(diff: Mapping[str, Any]) -> list[str]:
    lines = []
    if "layer" in diff:
        la, lb = diff["layer"]["a"], diff["layer"]["b"]
        lines.append(
            f"  layer: A {la.get('kind')} {la.get('index')} | B {lb.get('kind')} {lb.get('index')}"
        )
    for name in FIELDS:
        if name in diff:
            va, vb = diff[name]["a"], diff[name]["b"]
            if name == "fingerprint":
                va, vb = str(va)[:16], str(vb)[:16]
            lines.append(f"  {name}: A {va} | B {vb}")
    for key, pair in diff.get("context", {}).items():
        lines.append(f"  {key}: A {_value(pair['a'])} | B {_value(pair['b'])}")
    if "request" in diff:
        ra, rb = diff["request"]["a"], diff["request"]["b"]
        lines.append(
            f"  request: A {_value(ra) if ra else 'none (auto)'} | B {_value(rb) if rb else 'none (auto)'}"
        )
    if "policy_files" in diff:
        for side in ("a", "b"):
            files = diff["policy_files"][side]
            shown = (
                ", ".join(f"{f['path']} sha256:{str(f['sha256'])[:12]}" for f in files) or "none"
            )
            lines.append(f"  policy files {side.upper()}: {shown}")
    for rule_id, pair in diff.get("rules", {}).items():
        lines.append(f"  rule {rule_id}: A {_rule_text(pair['a'])} | B {_rule_text(pair['b'])}")
    if "variants" in diff:
        for side in ("a", "b"):
            for v in diff["variants"][side]:
                ranks = f" ranks {compress(v['ranks'])}" if v["ranks"] else ""
                hosts = f" on {', '.join(v['hosts'])}" if v["hosts"] else ""
                lines.append(
                    f"  {side.upper()} variant: {v['backend']} [{str(v['fingerprint'])[:12]}] "
                    f"{v['records']} record(s){ranks}{hosts}"
                )
    return lines


def _rule_text(rule: Mapping[str, Any] | None) -> str:
    if rule is None:
        return "absent"
    state = "matched" if rule.get("matched") else "not matched"
    backends = ", ".join(rule.get("backends") or [])
    return f"{rule.get('effect')} [{backends}] {state} ({rule.get('origin')})"


# --- Command --------------------------------------------------------------------------------


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``diff`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "diff",
        help="compare two audit logs or decision records, per layer",
        description="Compare two audit logs (JSON lines) or two decision records (explain --json) "
        "per layer signature: backend, fingerprint, differing context keys with their origins, "
        "request, policy file hashes, rules. Exit 0 identical, 1 different, 2 bad input.",
    )
    parser.add_argument("a", metavar="A", help="audit log or decision record")
    parser.add_argument("b", metavar="B", help="audit log or decision record")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument(
        "--shared-only",
        action="store_true",
        help="compare only layers both sides hold (e.g. logs of different pipeline stages)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Compare ``args.a`` with ``args.b``; 0 identical, 1 different, 2 bad input."""
    try:
        a, b = load(args.a), load(args.b)
    except DiffInputError as exc:
        print(f"moe-policy: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for loaded in (a, b):
        loaded.report_torn()
    result = compare(a, b, shared_only=bool(getattr(args, "shared_only", False)))
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        from moe_policy.cli.terminal import output_width

        print(render(result, output_width(sys.stdout)))
    return EXIT_IDENTICAL if result["identical"] else EXIT_DIFFERENT


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``diff`` alone (``python -m moe_policy.cli.diff A B``)."""
    parser = argparse.ArgumentParser(prog="moe-policy diff")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    return run(parser.parse_args(["diff", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

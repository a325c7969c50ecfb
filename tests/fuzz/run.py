"""The long fuzz run (``make fuzz``): thousands of generated cases through worker processes.

    python -m tests.fuzz.run [--policies N] [--models N] [--env N] [--flags N] [--special N]
                             [--diff N] [--matrix N]
                             [--seed S] [--jobs J] [--console N]

Every case is generated from ``--seed`` and its index, so a run (and any failure it finds)
is reproduced by the same numbers. Prints the counts per family and exit code, the
contract violations by class with one reproducer each, hangs, tracebacks and the peak
memory of any case; exits 1 when the contract was broken.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator

from tests.fuzz.contract import error_lines, failure_class, violations
from tests.fuzz.generators import GENERATORS, crafted_cases
from tests.fuzz.pool import Case, Outcome, Worker, run_console_script


def generate(counts: dict[str, int], seed: int) -> Iterator[Case]:
    """The crafted cases, then ``counts[family]`` generated cases of each family."""
    yield from crafted_cases()
    for family, count in counts.items():
        for index in range(count):
            yield GENERATORS[family](random.Random(f"{seed}:{family}:{index}"))


def run(cases: list[Case], jobs: int, progress: bool) -> list[Outcome]:
    """Run ``cases`` over ``jobs`` workers (threads feeding one worker process each)."""
    outcomes: list[Outcome | None] = [None] * len(cases)
    next_index = iter(range(len(cases)))
    lock = threading.Lock()
    done = [0]
    started = time.monotonic()

    def feed() -> None:
        worker = Worker()
        try:
            while True:
                with lock:
                    index = next(next_index, None)
                if index is None:
                    return
                outcomes[index] = worker.run(cases[index])
                with lock:
                    done[0] += 1
                    if progress and done[0] % 500 == 0:
                        rate = done[0] / (time.monotonic() - started)
                        print(
                            f"  {done[0]}/{len(cases)} cases ({rate:.0f}/s)",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            worker.stop()

    threads = [threading.Thread(target=feed) for _ in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [o for o in outcomes if o is not None]


def report(outcomes: list[Outcome], seconds: float) -> int:
    """Print the summary; the number of contract violations."""
    by_family: dict[str, Counter[str]] = defaultdict(Counter)
    classes: dict[str, list[tuple[Outcome, str]]] = defaultdict(list)
    for outcome in outcomes:
        by_family[outcome.case.kind][str(outcome.rc) if outcome.rc is not None else "none"] += 1
        for violation in violations(outcome):
            classes[failure_class(violation)].append((outcome, violation))
    total = Counter[str]()
    print(f"\n{len(outcomes)} cases in {seconds:.0f} s")
    print("exit codes per family:")
    for family, counter in sorted(by_family.items()):
        total.update(counter)
        shown = ", ".join(f"{code}: {n}" for code, n in sorted(counter.items()))
        print(f"  {family:8} {sum(counter.values()):6}  ({shown})")
    print(
        f"  {'all':8} {sum(total.values()):6}  ({', '.join(f'{c}: {n}' for c, n in sorted(total.items()))})"
    )
    hangs = sum(o.timed_out for o in outcomes)
    tracebacks = sum(bool(o.traceback) and not o.timed_out for o in outcomes)
    peak = max(outcomes, key=lambda o: o.peak_kb)
    no_position = Counter(
        _without_position(o.stderr)
        for o in outcomes
        if o.rc == 2 and "error: file:" in o.stderr and not _has_position(o.stderr)
    )
    slowest = max(outcomes, key=lambda o: o.seconds)
    print(f"tracebacks: {tracebacks}")
    print(f"hangs: {hangs}")
    print(
        f"peak memory of one case: {peak.peak_kb / 1024:.0f} MB ({peak.case.kind}: {peak.case.note})"
    )
    print(f"slowest case: {slowest.seconds:.2f} s ({slowest.case.kind}: {slowest.case.note})")
    print(f"descriptors left open after a case: {sum(o.fd_leak > 0 for o in outcomes)} cases")
    stray = Counter(line[:70] for o in outcomes if o.rc in (0, 1) for line in error_lines(o.stderr))
    print(f"stderr lines that are not JSON events on exit 0 or 1: {sum(stray.values())}")
    for line, n in stray.most_common(3):
        print(f"  {n:5} x {line}")
    bombs = [o for o in outcomes if "bomb" in o.case.note or "laughs" in o.case.note]
    if bombs:
        worst = max(bombs, key=lambda o: o.seconds)
        print(
            f"alias bombs: {len(bombs)} cases, exit codes {sorted({o.rc for o in bombs}, key=str)}, "
            f"slowest {worst.seconds * 1000:.0f} ms in process ({worst.case.note}, "
            f"{sum(len(d) for d in worst.case.files.values())} bytes)"
        )
    print(f"file errors without line:col: {sum(no_position.values())}")
    for message, n in no_position.most_common(8):
        print(f"  {n:5} x {message}")
    failed = sum(len(v) for v in classes.values())
    print(f"contract violations: {failed} in {len(classes)} classes")
    for name, found in sorted(classes.items(), key=lambda item: -len(item[1])):
        outcome, violation = min(
            found, key=lambda item: sum(len(d) for d in item[0].case.files.values())
        )
        print(f"\n== {len(found)} x {name}\n  {violation[:400]}\n  {outcome.case.describe()}")
        if outcome.traceback:
            print("  " + "\n  ".join(outcome.traceback.strip().splitlines()[-6:]))
    return failed


def _without_position(stderr: str) -> str:
    """The message of a file error, its path left out (for counting alike errors)."""
    import re

    line = next((x for x in stderr.splitlines() if x.startswith("moe-policy: error: file:")), "")
    message = line.partition("error: file:")[2]
    return re.sub(r"^\S*?: ", "", message)[:70]


def _has_position(stderr: str) -> bool:
    import re

    return re.search(r"error: file:[^\n]*?:\d+:\d+", stderr) is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz.run", description=__doc__.splitlines()[0]
    )
    knob = int(os.environ.get("FUZZ_CASES", "10000"))
    parser.add_argument("--policies", type=int, default=knob)
    parser.add_argument("--models", type=int, default=max(knob * 3 // 10, 1))
    parser.add_argument("--env", type=int, default=max(knob * 15 // 100, 1))
    parser.add_argument("--flags", type=int, default=max(knob // 10, 1))
    parser.add_argument("--special", type=int, default=max(knob // 50, 1))
    parser.add_argument("--diff", type=int, default=max(knob // 20, 1))
    parser.add_argument("--matrix", type=int, default=max(knob // 50, 1))
    parser.add_argument(
        "--console", type=int, default=20, help="cases also run through the console script"
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", "0")))
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("FUZZ_JOBS", "2")))
    args = parser.parse_args(argv)
    counts = {
        "policy": args.policies,
        "model": args.models,
        "env": args.env,
        "flags": args.flags,
        "special": args.special,
        "diff": args.diff,
        "matrix": args.matrix,
    }
    cases = list(generate(counts, args.seed))
    print(
        f"seed {args.seed}: {len(cases)} cases ({', '.join(f'{k} {v}' for k, v in counts.items())}, plus crafted) on {args.jobs} workers",
        file=sys.stderr,
    )
    started = time.monotonic()
    outcomes = run(cases, args.jobs, progress=True)
    rng = random.Random(args.seed)
    for case in rng.sample(cases, min(args.console, len(cases))):
        outcomes.append(run_console_script(case))
    return 1 if report(outcomes, time.monotonic() - started) else 0


if __name__ == "__main__":
    sys.exit(main())

"""What a fuzz test asserts: the case kept the contract, or the failure names the case."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from tests.fuzz.contract import violations
from tests.fuzz.pool import Case, Outcome, Worker

#: A case is drawn from ``random.Random(seed)`` by the generators the long run uses, so a
#: failing seed reproduces there (``GENERATORS[family](random.Random(seed))``).
SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
#: Hypothesis settings of the CI-sized fuzz tests: the same examples on every run
#: (derandomized, no example database), no deadline (a case runs in a worker process),
#: and no shrinking: the failure message already carries the whole case.
CI = settings(
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)


def contract_report(outcome: Outcome) -> str:
    """Empty when the case kept the contract, else what it broke, with the case."""
    broken = violations(outcome)
    if not broken:
        return ""
    return f"{broken}\n{outcome.case.describe()}\nstderr: {outcome.stderr[-2000:]}"


def assert_kept(outcome: Outcome) -> None:
    """Fail with the case and what it broke."""
    report = contract_report(outcome)
    assert report == "", report


def run_and_check(worker: Worker, case: Case) -> Outcome:
    outcome = worker.run(case)
    assert_kept(outcome)
    return outcome

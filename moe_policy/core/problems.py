"""Problems found in a policy document, and the sink that collects them.

Loading and linting share one parser: with a strict sink (loading) the first error is
raised at once as a ``PolicyError``; otherwise (lint) every problem is kept, so lint and
loading can never disagree about a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError


@dataclass(frozen=True)
class Problem:
    """A defect in a policy document: severity, code, message and location."""

    severity: str  # error | warning
    code: str
    message: str
    origin: str

    def as_error(self) -> PolicyError:
        return PolicyError(self.message, self.origin)


@dataclass
class ProblemSink:
    """Collects problems; ``strict`` raises the first error at once (loading), else keeps all (lint)."""

    strict: bool = True
    problems: list[Problem] = field(default_factory=list)

    def add(self, severity: str, code: str, message: str, origin: Origin | str) -> None:
        problem = Problem(severity, code, message, str(origin))
        if self.strict and severity == "error":
            raise problem.as_error()
        self.problems.append(problem)

"""Running a ``python -m`` entry point's ``main()`` in-process, for its usage errors."""

from __future__ import annotations

import sys
from typing import Any

import pytest


def main_error(module: Any, monkeypatch: Any, capsys: Any, *argv: str) -> str:
    """``module.main()`` with ``argv``: exit 2, no traceback; its error line."""
    monkeypatch.setattr(sys, "argv", [module.__name__, *argv])
    with pytest.raises(SystemExit) as exc:
        module.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]

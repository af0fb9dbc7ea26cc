"""docs/reliability.md names a test for every bad input: each row must name one, and each named test must
exist (a renamed or deleted test would leave a row without one)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_row_of_the_reliability_table_names_an_existing_test() -> None:
    doc = (REPO / "docs" / "reliability.md").read_text()
    table = doc[doc.index("## The table"):doc.index("## Other guarantees")]
    rows = [line for line in table.splitlines()
            if line.startswith("| ") and not line.startswith(("| bad input", "| toolkit |", "| ---"))]
    assert len(rows) > 40
    assert not [row for row in rows if "::test_" not in row.rsplit("|", 2)[-2]], "rows without a test"
    named = set(re.findall(r"`(test_\w+\.py)::(test_\w+)`", doc))
    missing = [f"{module}::{name}" for module, name in sorted(named)
               if not (REPO / "tests" / module).is_file()
               or not re.search(rf"^def {name}\(", (REPO / "tests" / module).read_text(), re.M)]
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"

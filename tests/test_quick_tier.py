"""The quick tier (`./run-tests.sh --quick`) names end-to-end tests that
exist: a renamed test or parameter would leave it silently."""
import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def quick_table():
    """QUICK of integration/conftest.py, read without importing it."""
    tree = ast.parse((REPO / "integration" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["QUICK"]:
            return ast.literal_eval(node.value)
    raise AssertionError("integration/conftest.py has no QUICK")


def test_every_quick_entry_is_a_collected_test():
    expected = set()
    for file, tests in quick_table().items():
        for name, ids in tests.items():
            for case in ids or [None]:
                expected.add(f"integration/{file}::{name}" + (f"[{case}]" if case else ""))
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "-m", "quick", "integration"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    collected = {line for line in out.splitlines() if line.startswith("integration/")}
    assert expected - collected == set(), "QUICK names tests that do not exist"
    assert collected == expected

"""The import graph of ``openrelay/``: no cycle between packages or between files (scripts/import_cycles.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_cycles.py"


def test_no_package_or_file_imports_what_imports_it() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("no cycle among ")

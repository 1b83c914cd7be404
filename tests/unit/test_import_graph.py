"""The import graph of ``openrelay/``: no cycle between packages or between files (scripts/import_cycles.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_cycles.py"


def test_no_package_or_file_imports_what_imports_it() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("no cycle among ")


def test_the_api_reads_through_services_and_imports_nothing_of_the_store() -> None:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    graph = script.module_imports(SCRIPT.parents[1] / "openrelay")
    reaching = {module: sorted(target for target in targets if target.startswith("openrelay.store"))
                for module, targets in graph.items() if module.startswith("openrelay.api")}
    assert {module: targets for module, targets in reaching.items() if targets} == {}

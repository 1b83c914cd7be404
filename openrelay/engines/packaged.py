"""Model files shipped inside installed Python packages (pip is the one download; nothing is fetched at run time):
the catalog names one ``package:relative/path``, found here without importing the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["packaged_file"]


def packaged_file(spec: str) -> Path:
    """``package:relative/path`` names a file inside an installed package; anything else is a path."""
    if ":" in spec and not spec.startswith("/"):
        package, name = spec.split(":", 1)
        found = importlib.util.find_spec(package)  # finds the folder without importing the package
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(f"package {package!r} carrying {name!r} is not installed")
        return Path(list(found.submodule_search_locations)[0]) / name
    return Path(spec)

"""The dashboard's vendored and own static files: pinned, as the manifest says, free of inline code."""

from __future__ import annotations

import hashlib
import re

from openrelay.web.static import STATIC_FILES, static_url
from openrelay.web.views import STATIC_DIR, chip_colour


def test_vendored_htmx_is_the_pinned_file():
    manifest = (STATIC_DIR / "VENDORED.txt").read_text()
    pinned = re.search(r"htmx\.org ([0-9.]+).*?sha256 ([0-9a-f]{64})", manifest, re.S)
    assert pinned is not None and pinned.group(1) == "2.0.11"
    assert hashlib.sha256((STATIC_DIR / "htmx.min.js").read_bytes()).hexdigest() == pinned.group(2)


def test_static_urls_carry_the_content_hash():
    for name, found in STATIC_FILES.items():
        assert static_url(name) == f"/static/{name}?v={found.digest[:16]}"


def test_templates_hold_no_inline_script_style_or_handler():
    for template in (STATIC_DIR.parent / "templates").glob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name
        assert "<style" not in text and not re.search(r"\sstyle=", text), template.name
        assert not re.search(r"\son[a-z]+=", text), template.name


def test_chip_colour_is_stable_and_spread():
    assert chip_colour("nightly") == chip_colour("nightly")
    assert len({chip_colour(f"tag-{i}") for i in range(100)}) == 12

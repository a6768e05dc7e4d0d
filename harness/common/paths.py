"""Where this checkout is: the one place that knows how deep the harness's modules sit in it."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

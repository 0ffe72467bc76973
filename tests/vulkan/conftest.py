"""The Vulkan backend's suite (run on lavapipe by `make test`, with validation: any validation
message fails the test, tests/conftest.py). Without a usable Vulkan device nothing here is
collected, and one line (in the header and at the end) says why: nothing fails."""

from __future__ import annotations

import json
from pathlib import Path

from vkutil import PARITY

import rlx

HERE = Path(__file__).resolve().parent
VULKAN = "vulkan" in rlx.backends()
WHY = rlx.build_info().get("vulkan", "this build has no Vulkan backend (setup.py said why)")
SKIPPED = f"tests/vulkan skipped: no usable Vulkan device ({WHY})"

if not VULKAN:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config):
    return f"vulkan: {WHY}" if VULKAN else SKIPPED


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    if not VULKAN:
        tr.write_line(SKIPPED)
        return
    if not PARITY:
        return
    tr.section("vulkan parity: max |vulkan - oracle|")
    for what in sorted(PARITY):
        tr.write_line(f"  {what:<58} {PARITY[what]:.3g}")
    out = HERE.parents[1] / "build" / "vulkan_parity.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(PARITY, indent=1, sort_keys=True))

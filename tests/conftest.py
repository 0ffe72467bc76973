"""Fixtures every suite shares.

`device`: every backend compiled into this build that can run here (rlx.backends(): "vulkan" only
where a Vulkan device is usable), so a test that takes `device` runs on each of them, and a new
backend is tested by all such tests with no list to edit.

Vulkan validation: with RLX_VULKAN_VALIDATION=1 (`make test` sets it, on lavapipe) every Vulkan
device runs under the Khronos validation layer, whose messages the core counts; a test during
which the count grows fails, showing the last message.
"""

from __future__ import annotations

import pytest

import rlx

VULKAN = "vulkan" in rlx.backends()


@pytest.fixture(params=rlx.backends())
def device(request) -> str:
    return request.param


def vulkan_validation() -> tuple[bool, int, str]:
    """(validation on, messages counted so far in this process, the last message)."""
    info = rlx.build_info()
    return (info.get("vulkan_validation") == "on", int(info.get("vulkan_validation_messages", 0)),
            info.get("vulkan_validation_last", ""))


@pytest.fixture(autouse=True)
def _no_vulkan_validation_messages():
    if not VULKAN:
        yield
        return
    _, before, _ = vulkan_validation()
    yield
    on, after, last = vulkan_validation()
    if on and after > before:
        pytest.fail(f"{after - before} Vulkan validation message(s) during this test; the last: {last}")

"""The Vulkan device itself: what rlx.devices(), describe() and build_info() report; the device
options; and bad input, each a clear exception after which the device (and the generator on it,
or on another device) still works: no driver at all (a child process whose loader finds none:
the module imports, backends() lists no vulkan, device="vulkan" raises naming the reason), an
allocation past the device's limit (MemoryError naming maxMemoryAllocationSize), an unknown
option or device index (ValueError)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlx

VALIDATING = os.environ.get("RLX_VULKAN_VALIDATION", "") not in ("", "0")


def test_devices_report_the_gpu_and_its_limits():
    vk = [d for d in rlx.devices() if d["backend"] == "vulkan"]
    assert vk and all(d["name"].startswith("vulkan:") for d in vk)
    d = next(d for d in vk if d["default"] == "yes")
    for key in ("device", "driver", "type", "api", "device_memory_bytes", "max_allocation", "max_shared_memory"):
        assert d[key] not in ("", 0), key
    assert d["subgroup_size"] >= 1 and d["max_workgroup_invocations"] >= 256
    assert d["max_storage_buffer_range"] >= 1 << 20 and d["storage_offset_alignment"] >= 1
    desc = rlx.Device("vulkan").describe()
    assert desc["device"] == d["device"] == rlx.build_info()["vulkan"]
    assert desc["transfers"] == ("mapped" if d["device_memory_host_visible"] == "yes" else "staged")
    assert desc["validation"] == ("on" if VALIDATING else "off")
    assert int(desc["validation_messages"]) == int(rlx.build_info()["vulkan_validation_messages"])
    assert not rlx.Device("vulkan").zero_copy and rlx.Device("cpu").zero_copy


def test_device_options():
    assert rlx.Device("vulkan:staging").describe()["transfers"] == "staged"
    limited = rlx.Device("vulkan:0,range=4096")
    assert limited.name == "vulkan:0,range=4096" and limited.describe()["binding_range"] == "4096"
    with pytest.raises(ValueError, match="unknown device option 'fast'"):
        rlx.Device("vulkan:fast")
    with pytest.raises(ValueError, match="'range=BYTES' with BYTES >= 1024"):
        rlx.Device("vulkan:range=12")
    with pytest.raises(ValueError, match="there is no device 9"):
        rlx.Device("vulkan:9")


def small_generator(device):
    cfg = rlx.Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=32)
    rng = np.random.default_rng(0)
    w = {n: (rng.standard_normal(s) * 0.3).astype(np.float32) for n, s in rlx.weights.expected_weights(cfg).items()}
    return rlx.Generator(cfg, w, device=device)


def test_an_allocation_past_the_device_limit_is_a_clear_memory_error():
    dev = rlx.Device("vulkan")
    n = int(dev.describe()["max_allocation"]) // 4 + 4096
    big = np.zeros(n, np.float32)   # zero pages the host never touches: refused before any copy
    g = rlx.Graph()
    g.output(g.add(g.input("x", (n,)), g.param("w", (n,))), "y")
    plan = rlx.compile(g, device=dev)
    with pytest.raises(MemoryError, match=r"exceeds the device's largest allocation \(maxMemoryAllocationSize"):
        plan.set_param("w", big)
    del big
    gen, cpu = small_generator(dev), small_generator("cpu")   # the device works as before
    gen.prefill([1, 2, 3])
    cpu.prefill([1, 2, 3])
    assert gen.generate_cached(6) == cpu.generate_cached(6)


def test_without_a_driver_vulkan_is_absent_and_refused_with_the_reason():
    code = textwrap.dedent("""
        import rlx
        assert "vulkan" not in rlx.backends(), rlx.backends()
        assert rlx.build_info()["vulkan"].startswith("unavailable: vulkan: no Vulkan driver"), rlx.build_info()
        assert [d["name"] for d in rlx.devices()] == ["cpu", "ref"]
        try:
            rlx.Device("vulkan")
        except rlx.Error as e:
            print("refused:", e)
        g = rlx.Graph()
        g.output(g.silu(g.input("x", (3,))), "y")
        import numpy as np
        print("cpu:", rlx.compile(g, device="cpu").run({"x": np.zeros(3, np.float32)})[0].tolist())
    """)
    env = dict(os.environ, VK_DRIVER_FILES="/nonexistent/icd.json", VK_ICD_FILENAMES="/nonexistent/icd.json")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: vulkan: no Vulkan driver is installed (Debian: apt-get install mesa-vulkan-drivers" in out.stdout
    assert "cpu: [0.0, 0.0, 0.0]" in out.stdout

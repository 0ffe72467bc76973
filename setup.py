"""Build of rlx: one CPython extension, ``rlx._C``, from every C file under csrc/.

Metadata lives in pyproject.toml; this file only describes the extension.

* Sources: every ``csrc/**/*.c`` (sorted, so builds are reproducible).
* BLAS: OpenBLAS only, found through pkg-config or the Debian paths. There is no
  fallback: a build without OpenBLAS fails with a message naming the package.
* Build facts reach C as string macros (RLX_BUILD_CC, RLX_BUILD_CFLAGS,
  RLX_BUILD_BLAS) so that ``rlx.build_info()`` can report them.
* ``RLX_SANITIZE=1`` builds with ASan + UBSan (-O1) instead of -O2
  (used by tools/run_asan_tests.sh).
* C files compile in parallel (``build_ext.parallel`` defaults to the CPU count).
* ``RLX_NO_EXT=1`` installs metadata/dependencies only (used by the Makefile, which
  then runs ``setup.py build_ext --inplace``).
* libcrypto (OpenSSL): the TCP transport's HMAC-SHA-256 handshake and frame MACs and its
  random nonces (csrc/distributed/auth.c). Found through pkg-config (``libcrypto``), else the
  Debian paths; without it the build fails with a message naming libssl-dev.
* Vulkan: ``csrc/backends/vulkan`` is built when the Vulkan headers (libvulkan-dev) and the shader
  tools (glslc, spirv-val) are there: tools/build_shaders.py compiles the GLSL shaders into
  SPIR-V C arrays under build/shaders (nothing binary is committed) and RLX_WITH_VULKAN is
  defined. No link-time libvulkan: the backend loads libvulkan.so.1 with dlopen at run time, so
  the extension imports on machines without Vulkan. Without the tools the build says why and
  leaves the backend out.
* MPI: ``csrc/distributed/mpi*.c`` are not part of ``rlx._C``; they form a second extension,
  ``rlx._mpi``, built only when ``mpicc --showme:compile`` / ``--showme:link`` work
  (flags taken from them). Without mpicc the build says why and skips it;
  ``rlx.distributed.MpiTransport()`` then raises rlx.Error.
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

BASE_CFLAGS = [
    "-std=c11",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fvisibility=hidden",
    "-D_GNU_SOURCE",
    "-DNPY_NO_DEPRECATED_API=NPY_1_21_API_VERSION",
    # Python's own CFLAGS carry -DNDEBUG; rlx keeps its invariant asserts on
    # (DESIGN.md §3), the same as in the C tests.
    "-UNDEBUG",
    # ... and -fwrapv, which would hide signed overflow from UBSan and differ
    # from the C tests' build.
    "-fno-wrapv",
]
OPT_CFLAGS = ["-O2"]
SANITIZE_FLAGS = [
    "-O1",
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=undefined",
]
SANITIZE_LDFLAGS = ["-fsanitize=address,undefined"]

BLAS_MISSING = (
    "OpenBLAS not found: install libopenblas-dev (Debian: apt-get install -y "
    "libopenblas-dev pkg-config; or run `make test`, which installs it). "
    "rlx links OpenBLAS only and has no fallback BLAS."
)


def _sanitize():
    return os.environ.get("RLX_SANITIZE", "") not in ("", "0")


CRYPTO_MISSING = (
    "OpenSSL's libcrypto not found: install libssl-dev (Debian: apt-get install -y "
    "libssl-dev pkg-config; or run `make test`, which installs it). The TCP transport "
    "authenticates ranks with its HMAC-SHA-256 and random nonces."
)


def _pkg_config(package, *args):
    exe = shutil.which("pkg-config")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args, package], check=True,
                             capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, OSError):
        return None
    return out.split()


def find_openblas():
    """Return (include_dirs, library_dirs) for OpenBLAS, or exit with a clear message."""
    cflags = _pkg_config("openblas", "--cflags")
    libs = _pkg_config("openblas", "--libs")
    if cflags is not None and libs is not None:
        inc = [f[2:] for f in cflags if f.startswith("-I")]
        libdirs = [f[2:] for f in libs if f.startswith("-L")]
        # pkg-config may report nothing for system paths; confirm cblas.h exists.
        candidates = inc + ["/usr/include", "/usr/local/include"]
        if any(os.path.isfile(os.path.join(d, "cblas.h")) for d in candidates):
            return inc, libdirs

    include_candidates = [
        "/usr/include/x86_64-linux-gnu/openblas-pthread",
        "/usr/include/aarch64-linux-gnu/openblas-pthread",
        "/usr/include/openblas",
        "/usr/local/include/openblas",
    ]
    lib_candidates = [
        "/usr/lib/x86_64-linux-gnu/openblas-pthread",
        "/usr/lib/aarch64-linux-gnu/openblas-pthread",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ]
    inc = next((d for d in include_candidates
                if os.path.isfile(os.path.join(d, "cblas.h"))), None)
    lib = next((d for d in lib_candidates
                if os.path.exists(os.path.join(d, "libopenblas.so"))), None)
    if inc is None or lib is None:
        sys.exit("error: " + BLAS_MISSING)
    return [inc], [lib]


def find_libcrypto():
    """Return (include_dirs, library_dirs) for OpenSSL's libcrypto, or exit with a clear message."""
    cflags = _pkg_config("libcrypto", "--cflags")
    libs = _pkg_config("libcrypto", "--libs")
    inc = [f[2:] for f in (cflags or []) if f.startswith("-I")]
    libdirs = [f[2:] for f in (libs or []) if f.startswith("-L")]
    header_dirs = inc + ["/usr/include", "/usr/local/include"]
    lib_dirs = libdirs + ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                          "/usr/local/lib"]
    have_header = any(os.path.isfile(os.path.join(d, "openssl", "evp.h")) for d in header_dirs)
    have_lib = any(os.path.exists(os.path.join(d, "libcrypto.so")) for d in lib_dirs)
    if not (have_header and have_lib):
        sys.exit("error: " + CRYPTO_MISSING)
    return inc, libdirs


def compiler_version():
    cc = os.environ.get("CC", "gcc").split()[0]
    try:
        out = subprocess.run([cc, "--version"], check=True,
                             capture_output=True, text=True).stdout
        return out.splitlines()[0].strip()
    except (subprocess.CalledProcessError, OSError, IndexError):
        return cc


def c_string(value):
    """A C string literal for use as a -D value (quotes and backslashes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


VULKAN_DIR = "csrc/backends/vulkan/"
SHADER_OUT = os.path.join("build", "shaders")


def find_vulkan():
    """(include_dirs, None) when the Vulkan backend can be built, else (None, why not)."""
    cflags = _pkg_config("vulkan", "--cflags") or []
    inc = [f[2:] for f in cflags if f.startswith("-I")]
    dirs = inc + ["/usr/include", "/usr/local/include"]
    if not any(os.path.isfile(os.path.join(d, "vulkan", "vulkan.h")) for d in dirs):
        return None, "vulkan/vulkan.h not found (Debian: apt-get install libvulkan-dev)"
    if not shutil.which("glslc") or not shutil.which("spirv-val"):
        return None, "glslc / spirv-val not found (Debian: apt-get install glslc spirv-tools)"
    return inc, None


def build_shaders():
    """Compiles the shaders into build/shaders (only what changed), or exits with glslc's message."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "build_shaders.py"), SHADER_OUT])
    if r.returncode != 0:
        sys.exit("error: building the Vulkan shaders failed (see above)")


def _csrc_files(*patterns):
    files = []
    for pat in patterns:
        files += glob.glob(os.path.join("csrc", "**", pat), recursive=True)
    return sorted(set(f.replace(os.sep, "/") for f in files))


MPI_SOURCES = ["csrc/distributed/mpi.c", "csrc/distributed/mpi_module.c"]


def c_sources(vulkan=True):
    return [f for f in _csrc_files("*.c") if f not in MPI_SOURCES and (vulkan or not f.startswith(VULKAN_DIR))]


def c_depends():
    # build_ext only looks at sources and `depends` when deciding to rebuild.
    return _csrc_files("*.h", "*.inc", "*.glsl", "*.comp", "*.list")


class BuildExt(build_ext):
    """build_ext that compiles in parallel by default and fails clearly without sources."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self):
        for ext in self.extensions:
            if not ext.sources:
                sys.exit("error: no C sources found under csrc/ (csrc/**/*.c)")
        super().run()


def make_extension():
    blas_inc, blas_libdirs = find_openblas()
    crypto_inc, crypto_libdirs = find_libcrypto()
    if _sanitize():
        cflags = BASE_CFLAGS + SANITIZE_FLAGS
        ldflags = SANITIZE_LDFLAGS
    else:
        cflags = BASE_CFLAGS + OPT_CFLAGS
        ldflags = []

    import numpy  # build requirement (pyproject.toml [build-system])

    macros = [
        ("RLX_BUILD_CC", c_string(compiler_version())),
        ("RLX_BUILD_CFLAGS", c_string(" ".join(cflags))),
        ("RLX_BUILD_BLAS", c_string("openblas")),
    ]
    if _sanitize():
        macros.append(("RLX_SANITIZE", "1"))
    vk_inc, why_not = find_vulkan()
    if vk_inc is None:
        print(f"rlx: building without the Vulkan backend: {why_not}", file=sys.stderr)
    else:
        build_shaders()
        macros.append(("RLX_WITH_VULKAN", "1"))

    return Extension(
        "rlx._C",
        sources=c_sources(vulkan=vk_inc is not None),
        depends=c_depends(),
        include_dirs=["csrc/include", "csrc", numpy.get_include(), *blas_inc, *crypto_inc,
                      *([SHADER_OUT, *vk_inc] if vk_inc is not None else [])],
        library_dirs=blas_libdirs + crypto_libdirs,
        runtime_library_dirs=blas_libdirs + crypto_libdirs,
        libraries=["openblas", "crypto", "pthread", "m", *(["dl"] if vk_inc is not None else [])],
        define_macros=macros,
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        language="c",
    )


def find_mpi():
    """(compile_flags, link_flags) from ``mpicc --showme:*``, or (None, why not)."""
    exe = shutil.which("mpicc")
    if exe is None:
        return None, "mpicc not found (Debian: apt-get install -y openmpi-bin libopenmpi-dev)"
    flags = []
    for what in ("compile", "link"):
        try:
            out = subprocess.run([exe, f"--showme:{what}"], check=True,
                                 capture_output=True, text=True).stdout
        except (subprocess.CalledProcessError, OSError) as e:
            return None, f"`mpicc --showme:{what}` failed ({e}); is mpicc Open MPI's?"
        flags.append(out.split())
    return flags[0], flags[1]


def make_mpi_extensions():
    """[rlx._mpi] when MPI is available, else [] (after saying why)."""
    mpi_cflags, mpi_ldflags = find_mpi()
    if mpi_cflags is None:
        print(f"rlx: building without MPI (rlx._mpi skipped): {mpi_ldflags}", file=sys.stderr)
        return []
    cflags = BASE_CFLAGS + (SANITIZE_FLAGS if _sanitize() else OPT_CFLAGS)
    ldflags = SANITIZE_LDFLAGS if _sanitize() else []
    return [Extension(
        "rlx._mpi",
        sources=MPI_SOURCES,
        depends=c_depends(),
        include_dirs=["csrc/include", "csrc"],
        define_macros=[("RLX_WITH_MPI", "1")],
        extra_compile_args=cflags + mpi_cflags,
        extra_link_args=ldflags + mpi_ldflags,
        language="c",
    )]


if os.environ.get("RLX_NO_EXT", "") not in ("", "0"):
    # Dependencies + editable finder only; the Makefile builds the extension
    # separately (`setup.py build_ext --inplace`) so that a C compile error
    # never leaves the virtual environment half set up.
    setup()
else:
    setup(ext_modules=[make_extension(), *make_mpi_extensions()], cmdclass={"build_ext": BuildExt})

# Builds the standalone C tests (tests/c/test_*.c) against the core C sources
# (every csrc/**/*.c except csrc/python/** (needs Python) and csrc/distributed/mpi* (needs MPI)), linked
# with OpenBLAS and OpenSSL's libcrypto (the TCP transport's HMAC; Debian: libssl-dev). Used by
# tools/run_c_tests.sh; incremental through -MMD depfiles and a flags stamp.
#
#   build/ctests/librlxcore.a        the core objects
#   build/ctests/bin/test_NAME       one program per tests/c/test_NAME.c
# Other tests/c/*.c files (not test_*) are shared helpers linked into every test.
# Every recipe removes its target first, so a failed compile never leaves a
# stale object or program behind (run_c_tests.sh asks `make -q` what is current).
#
#   make -f tools/ctests.mk OUT=build/tsan SANITIZE=-fsanitize=thread    a sanitizer build elsewhere

CC      ?= cc
OUT     ?= build/ctests
SANITIZE ?=
CORE    := $(shell find csrc -name '*.c' -not -path 'csrc/python/*' -not -path 'csrc/distributed/mpi*' 2>/dev/null | LC_ALL=C sort)
# The Vulkan backend when its shaders can be built (glslc): tools/build_shaders.py writes them
# into build/shaders as C; libvulkan itself is loaded at run time (dlopen).
VULKAN  := $(if $(shell command -v glslc 2>/dev/null),1,)
CORE    := $(if $(VULKAN),$(CORE),$(filter-out csrc/backends/vulkan/%,$(CORE)))
SHADERS := build/shaders/rlx_vk_shader_ids.h
SHADER_SRC := $(wildcard csrc/backends/vulkan/shaders/*)
TESTS   := $(sort $(wildcard tests/c/test_*.c))
HELPERS := $(filter-out $(TESTS),$(sort $(wildcard tests/c/*.c)))
OBJS    := $(CORE:%.c=$(OUT)/obj/%.o) $(HELPERS:%.c=$(OUT)/obj/%.o)
BINS    := $(TESTS:tests/c/%.c=$(OUT)/bin/%)

BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
# OpenSSL's libcrypto (csrc/distributed/auth.c; Debian: libssl-dev).
CRYPTO_CFLAGS := $(shell pkg-config --cflags libcrypto 2>/dev/null)
CRYPTO_LIBS   := $(shell pkg-config --libs libcrypto 2>/dev/null || echo -lcrypto)
RLX_CFLAGS  := -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE $(SANITIZE)
CPPFLAGS    := -Icsrc/include -Icsrc -Itests/c $(BLAS_CFLAGS) $(CRYPTO_CFLAGS) \
               -DRLX_BUILD_CC='"$(CC) (C tests)"' -DRLX_BUILD_CFLAGS='"$(RLX_CFLAGS)"' \
               -DRLX_BUILD_BLAS='"openblas"' -DRLX_C_TESTS=1
LDLIBS      := $(SANITIZE) $(BLAS_LIBS) $(CRYPTO_LIBS) -lpthread -lm
ifneq ($(VULKAN),)
CPPFLAGS    += -Ibuild/shaders -DRLX_WITH_VULKAN=1
LDLIBS      += -ldl
endif

all: $(BINS)

# Recompile everything when the flags change.
$(OUT)/flags: FORCE
	@mkdir -p $(OUT)
	@echo '$(CC) $(RLX_CFLAGS) $(CPPFLAGS) $(LDLIBS)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi

$(OUT)/obj/%.o: %.c $(OUT)/flags
	@mkdir -p $(dir $@); rm -f $@
	$(CC) $(RLX_CFLAGS) $(CPPFLAGS) -MMD -MP -c $< -o $@

# the generated shader headers exist before any Vulkan object compiles (the depfiles then track them)
$(filter $(OUT)/obj/csrc/backends/vulkan/%,$(OBJS)): $(SHADERS)
$(SHADERS): $(SHADER_SRC) tools/build_shaders.py
	$(or $(PYTHON),python3) tools/build_shaders.py build/shaders
	@touch $@

$(OUT)/librlxcore.a: $(OBJS)
	@rm -f $@
	ar rcs $@ $^

$(OUT)/bin/%: tests/c/%.c $(OUT)/librlxcore.a $(OUT)/flags
	@mkdir -p $(dir $@); rm -f $@
	$(CC) $(RLX_CFLAGS) $(CPPFLAGS) -MMD -MP $< -o $@ $(OUT)/librlxcore.a $(LDLIBS)

.PHONY: all FORCE
FORCE:

-include $(OBJS:.o=.d) $(BINS:=.d)

# Builds the C fuzz targets (tests/fuzz/<target>.c, each with LLVMFuzzerTestOneInput) two ways:
#
#   build/fuzz/bin/<target>      libFuzzer: $(FUZZ_CC) -fsanitize=fuzzer,address,undefined
#                                (tools/run_fuzz.sh, which finds a clang with libFuzzer and skips the
#                                target with one line when there is none; Debian: clang-15)
#   build/fuzz/replay/<target>   no libFuzzer: $(CC) -fsanitize=address,undefined with
#                                tests/fuzz/replay_main.c, which runs the target once per file
#                                (tests/fuzz/test_fuzz_replay.py: seeds and crash files under pytest)
#
# A target links only the core sources it exercises (FUZZ_SRC_<target>) and OpenSSL's libcrypto.
# The nonce generator: auth.c's rlx_crypto_random is renamed away here (-D on auth.c alone) and the
# target defines its own, so that nonces are predictable in these programs and an input replays
# exactly. The library and the extension keep auth.c's (RAND_bytes).
#
#   make -f tools/fuzz.mk FUZZ_CC=clang-15 build/fuzz/bin/tcp_wire
#   make -f tools/fuzz.mk build/fuzz/replay/tcp_wire

CC       ?= cc
FUZZ_CC  ?= clang
OUT      := build/fuzz
TARGETS  := tcp_wire
FUZZ_SRC_tcp_wire := csrc/core/status.c csrc/distributed/auth.c csrc/distributed/tcp.c \
                     csrc/distributed/tcp_handshake.c csrc/distributed/tcp_sock.c

CRYPTO_CFLAGS := $(shell pkg-config --cflags libcrypto 2>/dev/null)
CRYPTO_LIBS   := $(shell pkg-config --libs libcrypto 2>/dev/null || echo -lcrypto)
BASE_CFLAGS   := -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -fno-omit-frame-pointer
CPPFLAGS      := -Icsrc/include -Icsrc $(CRYPTO_CFLAGS)
FUZZ_FLAGS    := -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
REPLAY_FLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=all
# The harness itself (tests/fuzz/*.c) has no coverage instrumentation: its own branches and loops
# would only be noise to the fuzzer (and cost time); the core's coverage is what guides it.
HARNESS_FLAGS := $(REPLAY_FLAGS)
RENAME_RANDOM := -Drlx_crypto_random=rlx_crypto_random_os

all: $(TARGETS:%=$(OUT)/replay/%)

# $(1): variant (bin, replay), $(2): compiler, $(3) and $(4): the NAMES of the variables holding the
# flags of the core sources and of the harness (flags hold commas, which $(if) would split on)
define variant
$(OUT)/obj/$(1)/%.o: %.c $(OUT)/flags-$(1)
	@mkdir -p $$(dir $$@); rm -f $$@
	$(2) $(BASE_CFLAGS) $$(if $$(filter tests/fuzz/%,$$<),$$($(4)),$$($(3))) $(CPPFLAGS) \
	  $$(if $$(filter csrc/distributed/auth.c,$$<),$(RENAME_RANDOM)) -MMD -MP -c $$< -o $$@

$(OUT)/flags-$(1): FORCE
	@mkdir -p $(OUT)
	@echo '$(2) $(BASE_CFLAGS) $($(3)) $($(4)) $(CPPFLAGS) $(CRYPTO_LIBS)' > $$@.tmp
	@if cmp -s $$@.tmp $$@; then rm -f $$@.tmp; else mv -f $$@.tmp $$@; fi
endef
$(eval $(call variant,bin,$(FUZZ_CC),FUZZ_FLAGS,HARNESS_FLAGS))
$(eval $(call variant,replay,$(CC),REPLAY_FLAGS,REPLAY_FLAGS))

objs = $(patsubst %.c,$(OUT)/obj/$(2)/%.o,$(FUZZ_SRC_$(1)) tests/fuzz/$(1).c $(if $(filter replay,$(2)),tests/fuzz/replay_main.c))

.SECONDEXPANSION:
$(OUT)/bin/%: $$(call objs,%,bin)
	@mkdir -p $(dir $@); rm -f $@
	$(FUZZ_CC) $(FUZZ_FLAGS) $^ -o $@ $(CRYPTO_LIBS)

$(OUT)/replay/%: $$(call objs,%,replay)
	@mkdir -p $(dir $@); rm -f $@
	$(CC) $(REPLAY_FLAGS) $^ -o $@ $(CRYPTO_LIBS)

.PHONY: all FORCE
FORCE:

-include $(shell find $(OUT)/obj -name '*.d' 2>/dev/null)

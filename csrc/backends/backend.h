/*
 * backend.h - the backend vtable and the device (an instance of a backend).
 *
 * A backend is a table of functions with a context pointer: `open` makes an instance (its own
 * memory, queues, kernels' state), every other entry takes that context. It owns its memory
 * (buffers reached only through alloc / wrap / upload / download / copy), decides which ops it
 * runs (supports_op, the one capability gate), and compiles and runs a plan over a graph whose
 * values have been given buffers, offsets and concrete shapes by the runtime. The IR and the
 * passes know nothing else about a backend.
 *
 * The device (struct rlx_device, public in rlx.h) is what the rest of the core holds: the backend,
 * its instance, and counters of every byte that crosses between the host and the device. Every
 * buffer operation outside backends/ goes through the rlx_dev_* functions below (never the
 * vtable directly), so those counters are complete; tests read them to prove that weights are
 * uploaded once and that a decode step moves O(1) bytes.
 */
#ifndef RLX_BACKENDS_BACKEND_H
#define RLX_BACKENDS_BACKEND_H

#include <stdatomic.h>

#include "ir/graph.h"

/* A block of device memory. The device layer allocates the struct and sets `size` and `wrapped`;
 * the backend fills `data` (the host address, for backends whose memory the host can address;
 * NULL otherwise) and `impl` (its own handle). */
struct rlx_buffer {
    size_t size;   /* bytes */
    bool wrapped;  /* caller's host memory used in place (never written by kernels) */
    void *data;    /* host-addressable memory, or NULL */
    void *impl;    /* backend-specific */
    int64_t parts; /* > 0: not device memory but a weight store's table of parts (weights.c): `data`
                         holds `parts` pointers to host memory, one per part of a stacked weight whose
                         parts are not contiguous (experts read in place from a Hugging Face file);
                         only on devices that wrap host memory, only read by MATMUL_ID */

    /* the backend's (buffer_settle): bytes from the start advised for huge pages, and of those the
     * bytes collapsed into them */
    size_t huge_advised, huge_done;
};

/* Host memory for kernels' scratch, grown on demand with realloc and freed with free(): a plan's
 * own, or one that plans which never run at the same time share (struct rlx_shared_arena). */
struct rlx_workspace {
    void *data;
    size_t bytes;
};

/* A value placed in memory for one run: contiguous row-major. */
struct rlx_tensor {
    struct rlx_buffer *buf;
    size_t offset; /* bytes from the start of buf */
    enum rlx_dtype dtype;
    int ndim;
    int64_t shape[RLX_MAX_DIMS];
};

struct rlx_backend {
    const char *name;
    /* An instance; arg is what followed "name:" in the device string, or NULL. */
    rlx_status (*open)(const char *arg, void **ctx);
    void (*close)(void *ctx);
    /* "key=value\n" lines describing the backend (and instance, when ctx is not NULL) into buf. */
    void (*describe)(void *ctx, char *buf, size_t cap);
    bool (*supports_op)(void *ctx, const struct rlx_graph *g, int id);
    /* Fills b (b->size bytes, zeroed). */
    rlx_status (*buffer_alloc)(void *ctx, struct rlx_buffer *b);
    /* Makes b a zero-copy view of host memory the caller keeps alive. NULL for backends whose
     * kernels cannot read host memory. */
    rlx_status (*buffer_wrap)(void *ctx, struct rlx_buffer *b, const void *host);
    /* Frees what alloc / wrap made (not the struct). */
    void (*buffer_release)(void *ctx, struct rlx_buffer *b);
    /* See rlx_dev_settle; NULL where nothing is gained (device memory). */
    bool (*buffer_settle)(void *ctx, struct rlx_buffer *b, size_t bytes, bool move);
    /* See rlx_dev_discard; NULL where memory is not given back piecewise. */
    void (*buffer_discard)(void *ctx, struct rlx_buffer *b, size_t offset, size_t bytes);
    rlx_status (*upload)(void *ctx, struct rlx_buffer *b, size_t offset, const void *src, size_t bytes);
    rlx_status (*download)(void *ctx, const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes);
    rlx_status (*copy)(void *ctx, struct rlx_buffer *dst, size_t dst_offset, const struct rlx_buffer *src,
                       size_t src_offset, size_t bytes);
    /* opts: the plan's (the backend honours batch_invariant) */
    rlx_status (*plan_compile)(void *ctx, const struct rlx_graph *g, const struct rlx_compile_opts *opts, void **state);
    void (*plan_free)(void *ctx, void *state);
    /* Executes every live node in id order; values: (g->n_nodes) placed values. node_seconds, when
     * not NULL, receives each node's wall time (g->n_nodes entries; nodes not run get 0). */
    rlx_status (*plan_run)(void *ctx, void *state, const struct rlx_graph *g, const struct rlx_tensor *values,
                           double *node_seconds);
    /* Optional (NULL where kernels need no host scratch): from now on the plan's kernels take their
     * scratch from *ws, which outlives the state and which its owner frees (the state frees only its
     * own). */
    void (*plan_share_workspace)(void *ctx, void *state, struct rlx_workspace *ws);
    /* Optional (NULL for backends that always run: the host ones). usable: whether a device can be
     * opened on this machine (rlx_backends() lists only those); list_devices: one record of
     * "key=value" lines per device that can be opened, each ending with an empty line. */
    bool (*usable)(void);
    void (*list_devices)(char *buf, size_t cap);
};

extern const struct rlx_backend rlx_cpu_backend;
extern const struct rlx_backend rlx_ref_backend;
#ifdef RLX_WITH_VULKAN
extern const struct rlx_backend rlx_vulkan_backend;
#endif

/* The backend with this name, or RLX_ERR_INVALID listing the ones compiled in. */
rlx_status rlx_backend_find(const char *name, const struct rlx_backend **out);

struct rlx_device {
    const struct rlx_backend *be;
    void *ctx;
    char name[32];
    atomic_uint_least64_t upload_bytes, download_bytes, copy_bytes, uploads, downloads;
    atomic_size_t allocated_bytes, wrapped_bytes;
    atomic_int live_buffers; /* buffers not yet freed: rlx_device_free asserts 0 */
};

/* Counted buffer operations. alloc: zeroed memory. wrap: a zero-copy view of host memory
 * (RLX_ERR_UNSUPPORTED on a backend that cannot; see rlx_dev_can_wrap); if *inout is a wrapper
 * already it is re-pointed. free of NULL is a no-op. */
rlx_status rlx_dev_alloc(struct rlx_device *d, size_t bytes, struct rlx_buffer **out);
/* The first `bytes` of b hold, or are about to be given, rows that every step reads whole (a KV
 * cache's): the backend may move them to pages that read faster (buffer_settle); with `move`, also
 * the ones already written, which costs time. Whether it moved written ones. */
bool rlx_dev_settle(struct rlx_device *d, struct rlx_buffer *b, size_t bytes, bool move);
/* Whether the device settles buffers at all (host memory in pages). */
bool rlx_dev_settles(const struct rlx_device *d);
/* Nothing will read these bytes of b again before they are written: the backend may give back the
 * memory behind them (host devices: the whole pages inside the range; they read as zeros after). */
void rlx_dev_discard(struct rlx_device *d, struct rlx_buffer *b, size_t offset, size_t bytes);
bool rlx_dev_can_wrap(const struct rlx_device *d);
rlx_status rlx_dev_wrap(struct rlx_device *d, const void *host, size_t bytes, struct rlx_buffer **inout);
void rlx_dev_free(struct rlx_device *d, struct rlx_buffer *b);
rlx_status rlx_dev_upload(struct rlx_device *d, struct rlx_buffer *b, size_t offset, const void *src, size_t bytes);
rlx_status rlx_dev_download(struct rlx_device *d, const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes);
rlx_status rlx_dev_copy(struct rlx_device *d, struct rlx_buffer *dst, size_t dst_offset, const struct rlx_buffer *src,
                        size_t src_offset, size_t bytes);
/* Host data into *buf: a zero-copy wrapper when the device allows, else an owned buffer of at
 * least `bytes` (grown, never shrunk; *cap its size) filled by upload. */
rlx_status rlx_dev_place(struct rlx_device *d, const void *data, size_t bytes, struct rlx_buffer **buf, size_t *cap);

int64_t rlx_tensor_numel(const struct rlx_tensor *t);

#endif

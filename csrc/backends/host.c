/*
 * host.c - host-memory buffers and the dispatcher shared by the cpu and ref backends. The
 * dispatcher reads each live node's placed inputs and output, checks what only run time can
 * know (token ids in range, slices inside symbolic extents), and makes one kernel-table call.
 * Kernels never see the graph.
 */
#include <assert.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "backends/host.h"

/* ---- instances and buffers ---------------------------------------------------------------- */

rlx_status rlx_host_open(const char *arg, void **ctx)
{
    if (arg && *arg) return rlx_set_error(RLX_ERR_INVALID, "host devices take no argument (got ':%s')", arg);
    *ctx = NULL;
    return RLX_OK;
}

void rlx_host_close(void *ctx) { (void)ctx; }

/* Buffers of at least this many bytes are anonymous mappings: zero pages committed only as they
 * are written (a KV cache reserved for the whole context costs what it holds), returned to the
 * system at once when freed. Smaller ones come from the heap. (At 1 MiB, a KV cache's layer
 * buffers of 256 and 512 positions came from the heap, and growing past them left holes there that
 * the heap kept: Llama-3.2-1B Q4_K_M, f16 cache, a 1024-token prompt, 24 MiB of RSS.) */
#define MAP_MIN_BYTES ((size_t)64 << 10)
static char mapped_tag; /* b->impl == &mapped_tag: b->data is a mapping of b->size bytes */

/* KV cache rows in 2 MiB pages. Mappings of 2 MiB and more start at a 2 MiB boundary, and
 * rlx_host_buffer_settle advises the whole 2 MiB pages of a buffer's first `bytes`
 * MADV_HUGEPAGE, and with `move` collapses the ones already written in 4 KiB pages (MADV_COLLAPSE,
 * Linux 6.1+), so that transparent huge pages back them where the system allows (THP "madvise" or
 * "always"; a process may opt out with prctl(PR_SET_THP_DISABLE)). The KV cache settles the rows a
 * step is about to hold (kv_cache.c): a prompt's whole pages fault in as 2 MiB pages; the page of
 * each buffer that decode fills stays in 4 KiB pages until its rows fill it, then is collapsed,
 * one buffer a step (on this VM a collapse took ~5 ms: Qwen3-0.6B's 56 buffers at once made one
 * step 300 ms long). So a buffer of its own commits no more than its rows (rounded to 4 KiB); a
 * small cache's shared buffer (kv_cache.c's arena) about the rows of its capacity.
 * Why: a decode step's attention reads every row of the cache, each chunk's rows prefetched in
 * software while the chunk before is computed (the hardware prefetchers do not follow its order);
 * through 4 KiB pages that ran at 13-16 GB/s of K + V, through 2 MiB pages at 23-25, near the
 * kernel's compute bound (Zen 4, Qwen3-0.6B's shape, f16, 1024-4096 positions, one thread, a C
 * harness over 28 layers' caches; 20-26 -> 26-30 GB/s at two threads; 15 % in another hour of this
 * shared host); in the model, Qwen3-0.6B Q4_K_M at one thread decodes 1.0-1.26x faster at 1024-2048
 * positions with the host's state (benchmarks/README.md, "the KV cache in 2 MiB pages", which also
 * has the cost: a 2 MiB fault on a VM whose freed 2 MiB blocks go back to the host takes ~4 ms
 * where 512 faults of 4 KiB pages take ~1.1). */
#define HUGE_BYTES ((size_t)2 << 20)
#if defined(__linux__) && !defined(MADV_COLLAPSE)
#define MADV_COLLAPSE 25 /* Linux's value; older kernels refuse it (EINVAL) and nothing changes */
#endif

/* An anonymous mapping of n bytes, at a HUGE_BYTES boundary when n >= HUGE_BYTES; NULL when out of
 * address space. */
static void *map_anonymous(size_t n)
{
    const int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (n < HUGE_BYTES) {
        void *p = mmap(NULL, n, prot, flags, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (n > SIZE_MAX - 2 * HUGE_BYTES) return NULL;
    n = (n + page - 1) / page * page;
    char *p = mmap(NULL, n + HUGE_BYTES, prot, flags, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    munmap(a + n, (size_t)(p + HUGE_BYTES - a)); /* the tail: from the end to p + n + HUGE_BYTES */
    return a;
}

rlx_status rlx_host_buffer_alloc(void *ctx, struct rlx_buffer *b)
{
    (void)ctx;
    if (b->size >= MAP_MIN_BYTES) {
        void *p = map_anonymous(b->size);
        if (!p) return rlx_set_error(RLX_ERR_NOMEM, "out of memory mapping a %zu-byte buffer", b->size);
        b->data = p;
        b->impl = &mapped_tag;
        return RLX_OK;
    }
    size_t rounded = rlx_align_up(b->size ? b->size : 1);
    b->data = aligned_alloc(RLX_ALIGN, rounded);
    if (!b->data) return rlx_set_error(RLX_ERR_NOMEM, "out of memory allocating a %zu-byte buffer", b->size);
    memset(b->data, 0, rounded);
    b->impl = NULL;
    return RLX_OK;
}

bool rlx_host_buffer_settle(void *ctx, struct rlx_buffer *b, size_t bytes, bool move)
{
    (void)ctx;
    if (b->impl != &mapped_tag) return false;
    const size_t end = (bytes < b->size ? bytes : b->size) & ~(HUGE_BYTES - 1);
#ifdef __linux__
    char *p = (char *)b->data;
    if (end > b->huge_advised) /* a hint: refused, the pages stay small */
        (void)madvise(p + b->huge_advised, end - b->huge_advised, MADV_HUGEPAGE);
    b->huge_advised = end > b->huge_advised ? end : b->huge_advised;
    if (!move || b->huge_done >= b->huge_advised) return false;
    /* 0: pages were there to collapse (or already huge); EINVAL where none were written yet */
    const bool moved = madvise(p + b->huge_done, b->huge_advised - b->huge_done, MADV_COLLAPSE) == 0;
    b->huge_done = b->huge_advised;
    return moved;
#else
    (void)end, (void)move;
    return false;
#endif
}

void rlx_host_buffer_discard(void *ctx, struct rlx_buffer *b, size_t offset, size_t bytes)
{
    (void)ctx;
    if (b->impl != &mapped_tag) return;
#ifdef __linux__
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), from = (uintptr_t)b->data + offset,
                    lo = (from + page - 1) & ~(page - 1), hi = (from + bytes) & ~(page - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* private anonymous: zeros after */
#else
    (void)offset, (void)bytes;
#endif
}

rlx_status rlx_host_buffer_wrap(void *ctx, struct rlx_buffer *b, const void *host)
{
    (void)ctx;
    b->data = (void *)host; /* read-only by contract: kernels never write wrapped buffers */
    b->impl = NULL;
    return RLX_OK;
}

void rlx_host_buffer_release(void *ctx, struct rlx_buffer *b)
{
    (void)ctx;
    if (!b->wrapped && b->impl == &mapped_tag)
        munmap(b->data, b->size);
    else if (!b->wrapped)
        free(b->data);
    b->data = b->impl = NULL;
}

rlx_status rlx_host_upload(void *ctx, struct rlx_buffer *b, size_t offset, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy((char *)b->data + offset, src, bytes);
    return RLX_OK;
}

rlx_status rlx_host_download(void *ctx, const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes)
{
    (void)ctx;
    memcpy(dst, (const char *)b->data + offset, bytes);
    return RLX_OK;
}

rlx_status rlx_host_copy(void *ctx, struct rlx_buffer *dst, size_t dst_offset, const struct rlx_buffer *src,
                         size_t src_offset, size_t bytes)
{
    (void)ctx;
    memmove((char *)dst->data + dst_offset, (const char *)src->data + src_offset, bytes);
    return RLX_OK;
}

/* ---- plan state --------------------------------------------------------------------------- */

rlx_status rlx_host_state_create(const struct rlx_kernels *k, bool batch_invariant, void **state)
{
    struct rlx_host_state *st = rlx_calloc(1, sizeof *st);
    if (!st) return RLX_ERR_NOMEM;
    st->k = k;
    st->batch_invariant = batch_invariant;
    st->ws = &st->own;
    *state = st;
    return RLX_OK;
}

void rlx_host_state_free(void *ctx, void *state)
{
    (void)ctx;
    struct rlx_host_state *st = state;
    if (!st) return;
    free(st->own.data);
    free(st->experts);
    free(st);
}

void rlx_host_share_workspace(void *ctx, void *state, struct rlx_workspace *ws)
{
    (void)ctx;
    struct rlx_host_state *st = state;
    free(st->own.data);
    st->own = (struct rlx_workspace){0};
    st->ws = ws;
}

/* The kernels' scratch holds at least `floats` (the pointer, which may move: st->ws->data). */
static rlx_status need_scratch(struct rlx_host_state *st, size_t floats)
{
    struct rlx_workspace *ws = st->ws;
    if (floats <= ws->bytes / sizeof(float)) return RLX_OK;
    /* grown empty: nothing reads the old contents, which realloc would copy on a move */
    free(ws->data);
    ws->data = NULL, ws->bytes = 0;
    float *p = malloc(floats * sizeof *p);
    if (!p) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %zu floats of kernel scratch", floats);
    ws->data = p;
    ws->bytes = floats * sizeof *p;
    return RLX_OK;
}

static float *scratch_of(const struct rlx_host_state *st) { return st->ws->data; }

static rlx_status need_experts(struct rlx_host_state *st, size_t n)
{
    if (n <= st->expert_cap) return RLX_OK;
    const void **p = realloc(st->experts, n * sizeof *p);
    if (!p) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %zu expert pointers", n);
    st->experts = p;
    st->expert_cap = n;
    return RLX_OK;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static bool is_lowp(enum rlx_dtype dt) { return dt == RLX_F16 || dt == RLX_BF16; }
static bool is_block(enum rlx_dtype dt) { return rlx_dtype_traits(dt)->block_size > 1; }

bool rlx_host_supports_op(void *ctx, const struct rlx_graph *g, int id)
{
    (void)ctx;
    const struct rlx_node *n = &g->nodes[id];
    return (unsigned)n->op < RLX_OP_COUNT; /* the shape rules already restrict dtypes to what runs */
}

static void *ptr(const struct rlx_tensor *t) { return (char *)t->buf->data + t->offset; }
static const float *fin(const struct rlx_tensor *v, const struct rlx_node *n, int k) { return ptr(&v[n->in[k]]); }

static int64_t rows_of(const struct rlx_tensor *t) /* product of all dims but the last */
{
    int64_t r = 1;
    for (int i = 0; i + 1 < t->ndim; i++) r *= t->shape[i];
    return r;
}

/* Bytes of n elements of dt (n whole blocks: the shape rules and the runtime have checked). */
static size_t bytes_of(enum rlx_dtype dt, int64_t n)
{
    size_t b = 0;
    rlx_status s = rlx_dtype_bytes(dt, n, &b);
    (void)s;
    assert(s == RLX_OK);
    return b;
}

/* Copies `outer` blocks of `inner` bytes from src (stride src_stride) to dst (stride dst_stride). */
static void copy_blocks(char *dst, size_t dst_stride, const char *src, size_t src_stride, int64_t outer, size_t inner)
{
    for (int64_t o = 0; o < outer; o++) memcpy(dst + (size_t)o * dst_stride, src + (size_t)o * src_stride, inner);
}

/* For an axis: elements before it (outer) and bytes of one index step along it (inner). */
static void axis_split(const struct rlx_tensor *t, int axis, int64_t *outer, size_t *step)
{
    int64_t o = 1, in = 1;
    for (int i = 0; i < axis; i++) o *= t->shape[i];
    for (int i = axis + 1; i < t->ndim; i++) in *= t->shape[i];
    *outer = o;
    *step = bytes_of(t->dtype, in);
}

static rlx_status run_embedding(const struct rlx_kernels *k, int id, const struct rlx_node *n,
                                const struct rlx_tensor *v)
{
    const struct rlx_tensor *table = &v[n->in[0]], *ids = &v[n->in[1]];
    const int32_t *idp = ptr(ids);
    int64_t count = rlx_tensor_numel(ids), vocab = table->shape[0];
    for (int64_t i = 0; i < count; i++)
        if (idp[i] < 0 || idp[i] >= vocab)
            return rlx_set_error(RLX_ERR_RANGE,
                                 "node %d (embedding): token id %d at position %lld is outside [0, %lld)", id, idp[i],
                                 (long long)i, (long long)vocab);
    if (table->dtype == RLX_F32)
        k->embedding_f32(ptr(&v[id]), ptr(table), idp, count, table->shape[1]);
    else if (is_lowp(table->dtype))
        k->embedding_lowp(ptr(&v[id]), ptr(table), table->dtype, idp, count, table->shape[1]);
    else
        k->embedding_quant(ptr(&v[id]), ptr(table), table->dtype, idp, count, table->shape[1]);
    return RLX_OK;
}

static rlx_status run_attention(struct rlx_host_state *st, int id, const struct rlx_node *n, const struct rlx_tensor *v,
                                const struct rlx_tensor *out)
{
    const struct rlx_tensor *q = &v[n->in[0]], *kt = &v[n->in[1]];
    struct rlx_attn_args a = {
        .out = ptr(out),
        .q = ptr(q),
        .k = ptr(kt),
        .v = ptr(&v[n->in[2]]),
        .kv_dtype = kt->dtype,
        .S = q->shape[0],
        .T = kt->shape[0],
        .Hq = q->shape[1],
        .Hkv = kt->shape[1],
        .D = q->shape[2],
        .scale = n->attrs.scale,
        .causal = n->attrs.causal,
        .window = n->attrs.window,
    };
    if (a.T < a.S)
        return rlx_set_error(RLX_ERR_SHAPE,
                             "node %d (attention): %lld keys for %lld queries; the queries are the "
                             "last positions of the keys (T >= S)",
                             id, (long long)a.T, (long long)a.S);
    if (n->n_in == 4) {
        const struct rlx_tensor *m = &v[n->in[3]];
        if (m->dtype == RLX_F32)
            a.mask_f32 = ptr(m);
        else
            a.mask_u8 = ptr(m);
    }
    RLX_TRY(need_scratch(st, st->k->attention_scratch(&a)));
    a.scratch = scratch_of(st);
    st->k->attention(&a);
    return RLX_OK;
}

/* Every expert id of ids (count of them) in [0, E). */
static rlx_status check_ids(int id, const struct rlx_node *n, const struct rlx_tensor *ids, int64_t E)
{
    const int32_t *p = ptr(ids);
    const int64_t count = rlx_tensor_numel(ids), per_row = ids->shape[ids->ndim - 1];
    for (int64_t i = 0; i < count; i++)
        if (p[i] < 0 || p[i] >= E)
            return rlx_set_error(RLX_ERR_RANGE, "node %d (%s): expert id %d (row %lld, slot %lld) is outside [0, %lld)",
                                 id, rlx_op_name(n->op), p[i], (long long)(i / per_row), (long long)(i % per_row),
                                 (long long)E);
    return RLX_OK;
}

/* The kernel gets one pointer per expert: into the stacked weight, or a weight store's parts. */
static rlx_status run_matmul_id(struct rlx_host_state *st, int id, const struct rlx_node *n, const struct rlx_tensor *v,
                                const struct rlx_tensor *out)
{
    const struct rlx_tensor *a = &v[n->in[0]], *ids = &v[n->in[1]], *w = &v[n->in[2]];
    const int64_t E = w->shape[0], N = w->shape[1], K = w->shape[2], R = ids->shape[0] * ids->shape[1];
    RLX_TRY(check_ids(id, n, ids, E));
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX)
        return rlx_set_error(RLX_ERR_UNSUPPORTED,
                             "node %d (matmul_id): dims %lld x %lld x %lld exceed the BLAS's "
                             "32-bit sizes",
                             id, (long long)R, (long long)K, (long long)N);
    RLX_TRY(need_experts(st, (size_t)E));
    if (w->buf->parts) {
        assert(w->buf->parts == E && w->offset == 0);
        memcpy(st->experts, w->buf->data, (size_t)E * sizeof *st->experts);
    } else {
        const size_t expert = bytes_of(w->dtype, N * K);
        for (int64_t e = 0; e < E; e++) st->experts[e] = (const char *)ptr(w) + (size_t)e * expert;
    }
    struct rlx_matmul_id_args args = {.out = ptr(out),
                                      .a = ptr(a),
                                      .ids = ptr(ids),
                                      .w = st->experts,
                                      .w_dtype = w->dtype,
                                      .S = ids->shape[0],
                                      .A = a->shape[1],
                                      .n = ids->shape[1],
                                      .K = K,
                                      .N = N,
                                      .E = E,
                                      .rows_alone = st->batch_invariant ? st->k->matmul_rows_alone(w->dtype, 1) : 0};
    RLX_TRY(need_scratch(st, st->k->matmul_id_scratch(&args)));
    args.scratch = scratch_of(st);
    st->k->matmul_id(&args);
    return RLX_OK;
}

/* Rows pos[i] of the state get rows[i], converted to the state's dtype. */
static rlx_status run_cache_write(const struct rlx_kernels *k, int id, const struct rlx_node *n,
                                  const struct rlx_tensor *v)
{
    const struct rlx_tensor *state = &v[n->in[0]], *rows = &v[n->in[1]], *pos = &v[n->in[2]];
    const int32_t *pp = ptr(pos);
    const int64_t S = rows->shape[0], T = state->shape[0], row = S ? rlx_tensor_numel(rows) / S : 0;
    for (int64_t i = 0; i < S; i++)
        if (pp[i] < 0 || pp[i] >= T)
            return rlx_set_error(RLX_ERR_RANGE,
                                 "node %d (cache_write): position %d of row %lld is outside the "
                                 "state's %lld rows",
                                 id, pp[i], (long long)i, (long long)T);
    const size_t row_bytes = bytes_of(state->dtype, row);
    for (int64_t i = 0; i < S; i++)
        k->convert_f32((char *)ptr(state) + (size_t)pp[i] * row_bytes, state->dtype, fin(v, n, 1) + i * row, row);
    return RLX_OK;
}

static rlx_status run_node(struct rlx_host_state *st, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_kernels *k = st->k;
    const struct rlx_node *n = &g->nodes[id];
    if (n->op == RLX_OP_INPUT || n->op == RLX_OP_PARAM || n->op == RLX_OP_STATE || n->op == RLX_OP_RESHAPE ||
        n->op == RLX_OP_FUSED_OUT)
        return RLX_OK; /* bound by the caller / an alias placed by the runtime / written by the producer */
    const struct rlx_tensor *out = &v[id];
    float *o = ptr(out);
    switch (n->op) {
    case RLX_OP_INPUT:
    case RLX_OP_PARAM:
    case RLX_OP_STATE:
    case RLX_OP_RESHAPE:
    case RLX_OP_FUSED_OUT: return RLX_OK;
    case RLX_OP_MATMUL: {
        const struct rlx_tensor *a = &v[n->in[0]], *b = &v[n->in[1]];
        int64_t M = rows_of(a), K = a->shape[a->ndim - 1], N = out->shape[out->ndim - 1];
        if (M > INT_MAX || K > INT_MAX || N > INT_MAX)
            return rlx_set_error(RLX_ERR_UNSUPPORTED,
                                 "node %d (matmul): dims %lld x %lld x %lld exceed the BLAS's "
                                 "32-bit sizes",
                                 id, (long long)M, (long long)K, (long long)N);
        /* a batch-invariant plan, a decode step's product: groups of rows the kernels compute each as alone */
        const int64_t group =
            st->batch_invariant && M <= RLX_INVARIANT_ROWS ? k->matmul_rows_alone(b->dtype, n->attrs.trans_b) : M;
        const float *x = fin(v, n, 0);
        for (int64_t m0 = 0; m0 < M; m0 += group) {
            const int64_t rows = M - m0 < group ? M - m0 : group;
            if (b->dtype == RLX_F32) {
                k->matmul_f32(o + m0 * N, x + m0 * K, ptr(b), rows, K, N, n->attrs.trans_b);
            } else if (is_block(b->dtype)) {
                RLX_TRY(need_scratch(st, k->matmul_quant_scratch(b->dtype, rows, K, N)));
                k->matmul_quant(o + m0 * N, x + m0 * K, ptr(b), b->dtype, rows, K, N, scratch_of(st));
            } else {
                RLX_TRY(need_scratch(st, k->matmul_lowp_scratch(rows, K, N)));
                k->matmul_lowp(o + m0 * N, x + m0 * K, ptr(b), b->dtype, rows, K, N, scratch_of(st));
            }
        }
        return RLX_OK;
    }
    case RLX_OP_EMBEDDING: return run_embedding(k, id, n, v);
    case RLX_OP_RMSNORM:
        k->rmsnorm_f32(o, fin(v, n, 0), fin(v, n, 1), rows_of(out), out->shape[out->ndim - 1], n->attrs.eps);
        return RLX_OK;
    case RLX_OP_ADD_RMSNORM:
        k->add_rmsnorm_f32(o, ptr(&v[n->companion]), fin(v, n, 0), fin(v, n, 1), fin(v, n, 2), rows_of(out),
                           out->shape[out->ndim - 1], n->attrs.eps);
        return RLX_OK;
    case RLX_OP_ROPE:
        k->rope_f32(o, fin(v, n, 0), ptr(&v[n->in[1]]), fin(v, n, 2), out->shape[0], out->shape[1], out->shape[2],
                    n->attrs.interleaved);
        return RLX_OK;
    case RLX_OP_SOFTMAX: k->softmax_f32(o, fin(v, n, 0), rows_of(out), out->shape[out->ndim - 1]); return RLX_OK;
    case RLX_OP_SILU: k->silu_f32(o, fin(v, n, 0), rlx_tensor_numel(out)); return RLX_OK;
    case RLX_OP_SILU_MUL: k->silu_mul_f32(o, fin(v, n, 0), fin(v, n, 1), rlx_tensor_numel(out)); return RLX_OK;
    case RLX_OP_ADD:
    case RLX_OP_MUL: {
        int64_t nb = rlx_tensor_numel(&v[n->in[1]]);
        (n->op == RLX_OP_ADD ? k->add_f32 : k->mul_f32)(o, fin(v, n, 0), fin(v, n, 1), rlx_tensor_numel(out), nb);
        return RLX_OK;
    }
    case RLX_OP_ATTENTION: return run_attention(st, id, n, v, out);
    case RLX_OP_CACHE_WRITE: return run_cache_write(k, id, n, v);
    case RLX_OP_CONVERT: k->convert_f32(o, n->attrs.dtype, fin(v, n, 0), rlx_tensor_numel(out)); return RLX_OK;
    case RLX_OP_GATHER_LAST: {
        const struct rlx_tensor *x = &v[n->in[0]];
        if (x->shape[0] < 1) return rlx_set_error(RLX_ERR_SHAPE, "node %d (gather_last): the input has no rows", id);
        size_t row = bytes_of(out->dtype, rlx_tensor_numel(out));
        memcpy(o, (const char *)ptr(x) + (size_t)(x->shape[0] - 1) * row, row);
        return RLX_OK;
    }
    case RLX_OP_CONCAT: {
        const struct rlx_tensor *a = &v[n->in[0]], *b = &v[n->in[1]];
        int64_t outer;
        size_t step;
        axis_split(a, n->attrs.axis, &outer, &step);
        size_t sa = step * (size_t)a->shape[n->attrs.axis], sb = step * (size_t)b->shape[n->attrs.axis];
        copy_blocks((char *)o, sa + sb, ptr(a), sa, outer, sa);
        copy_blocks((char *)o + sa, sa + sb, ptr(b), sb, outer, sb);
        return RLX_OK;
    }
    case RLX_OP_SLICE: {
        const struct rlx_tensor *x = &v[n->in[0]];
        /* bounds were checked by the runtime before memory was planned */
        int64_t extent = x->shape[n->attrs.axis], start = n->attrs.start < 0 ? extent + n->attrs.start : n->attrs.start;
        int64_t outer;
        size_t step;
        axis_split(x, n->attrs.axis, &outer, &step);
        copy_blocks((char *)o, step * (size_t)n->attrs.len, (const char *)ptr(x) + step * (size_t)start,
                    step * (size_t)extent, outer, step * (size_t)n->attrs.len);
        return RLX_OK;
    }
    case RLX_OP_TOPK: {
        const struct rlx_tensor *x = &v[n->in[0]];
        const int64_t len = x->shape[x->ndim - 1];
        RLX_TRY(need_scratch(st, k->topk_scratch(len)));
        k->topk_f32(ptr(out), fin(v, n, 0), rows_of(x), len, n->attrs.k, scratch_of(st));
        return RLX_OK;
    }
    case RLX_OP_MATMUL_ID: return run_matmul_id(st, id, n, v, out);
    case RLX_OP_MOE_COMBINE: {
        const struct rlx_tensor *y = &v[n->in[0]], *probs = &v[n->in[1]], *ids = &v[n->in[2]];
        RLX_TRY(check_ids(id, n, ids, probs->shape[1]));
        k->moe_combine_f32(o, ptr(y), ptr(probs), ptr(ids), y->shape[0], y->shape[1], y->shape[2], probs->shape[1],
                           n->attrs.norm);
        return RLX_OK;
    }
    case RLX_OP_COUNT: break;
    }
    return rlx_set_error(RLX_ERR_INTERNAL, "node %d: no kernel for op %d", id, (int)n->op);
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

rlx_status rlx_host_run(void *ctx, void *state, const struct rlx_graph *g, const struct rlx_tensor *values,
                        double *node_seconds)
{
    (void)ctx;
    for (int id = 0; id < g->n_nodes; id++) {
        if (g->nodes[id].dead) continue;
        if (rlx_interrupted()) return rlx_set_error(RLX_ERR_INTERRUPTED, "interrupted (before node %d)", id);
        if (!node_seconds) {
            RLX_TRY(run_node(state, g, id, values));
            continue;
        }
        double t0 = now_seconds();
        RLX_TRY(run_node(state, g, id, values));
        node_seconds[id] = now_seconds() - t0;
    }
    return RLX_OK;
}

/*
 * rlx.h - the public C API of the rlx core: statuses, dtypes, symbolic dims, the graph builder,
 * compilation to a plan for one backend, and running a plan.
 *
 * Contracts that hold for every function here:
 * - Fallible functions return rlx_status (RLX_OK == 0, errors negative) and, on error, set a
 *   one-line thread-local message readable with rlx_last_error(). Results come back through
 *   out-parameters, which are left untouched on error.
 * - The library never prints, never exits and never calls into Python.
 * - rlx_x_create pairs with rlx_x_free; freeing NULL is a no-op.
 * - Pointers passed in are borrowed for the duration of the call unless a function says it keeps
 *   them (rlx_plan_set_param keeps the weight pointer until the plan is freed or the param is
 *   set again; rlx_plan_set_input keeps the input pointer until the next rlx_plan_run returns).
 * - A graph or plan is not safe to use from two threads at once; distinct objects are.
 */
#ifndef RLX_RLX_H
#define RLX_RLX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Statuses
 * ------------------------------------------------------------------------------------------- */

typedef int rlx_status;

enum {
    RLX_OK = 0,
    RLX_ERR_INVALID = -1,      /* bad argument: unknown name, wrong arity, bad attribute value */
    RLX_ERR_SHAPE = -2,        /* shapes do not fit together */
    RLX_ERR_DTYPE = -3,        /* wrong element type */
    RLX_ERR_RANGE = -4,        /* a value out of range: token id, position, context length */
    RLX_ERR_NOMEM = -5,        /* allocation failed or a memory budget refused */
    RLX_ERR_UNSUPPORTED = -6,  /* valid request that this build or backend does not implement */
    RLX_ERR_STATE = -7,        /* call not valid in the object's current state */
    RLX_ERR_IO = -8,           /* file or network failure */
    RLX_ERR_INTERNAL = -9,     /* a bug in rlx */
    RLX_ERR_INTERRUPTED = -10, /* rlx_interrupt() stopped the work; the object is as before the call */
};

/* The message of the last failing call on this thread ("" if none). Valid until the next
 * failing call on this thread. */
const char *rlx_last_error(void);
/* A short name for a status ("RLX_ERR_SHAPE"). */
const char *rlx_status_name(rlx_status s);

/* Interruption: rlx_interrupt() makes every plan run in progress stop before its next kernel and
 * return RLX_ERR_INTERRUPTED (a sequence then keeps its history and cache as before the step), and
 * so every run started until rlx_interrupt_clear(). Process-wide; async-signal-safe (it only sets
 * a flag), so a SIGINT handler may call it. */
void rlx_interrupt(void);
void rlx_interrupt_clear(void);
bool rlx_interrupted(void);

/* Logging: the core reports notable events (never errors, which are statuses) through one
 * callback. Default: none (silent). The callback may be called from any thread. */
enum rlx_log_level { RLX_LOG_DEBUG = 0, RLX_LOG_INFO = 1, RLX_LOG_WARN = 2 };
typedef void (*rlx_log_fn)(enum rlx_log_level level, const char *msg, void *user);
void rlx_set_log_callback(rlx_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------
 * Dtypes (append-only; tables indexed by this enum are static_assert'ed on RLX_DTYPE_COUNT)
 *
 * A dtype is a row of traits: elements are stored in blocks of `block_size` elements taking
 * `type_size` bytes (1 element per block for the plain types; the GGUF block types pack 32 or
 * 256 elements with their scales). A tensor's rows (its last dim) hold whole blocks.
 * ------------------------------------------------------------------------------------------- */

enum rlx_dtype {
    RLX_F32 = 0,
    RLX_F16 = 1,
    RLX_BF16 = 2,
    RLX_I32 = 3,
    RLX_U8 = 4,
    /* the GGUF block types (ggml's layouts; csrc/core/quants.c): elements per block / bytes */
    RLX_Q8_0 = 5,  /* 32 / 34: f16 scale, 32 int8 */
    RLX_Q4_0 = 6,  /* 32 / 18 */
    RLX_Q4_1 = 7,  /* 32 / 20 */
    RLX_Q5_0 = 8,  /* 32 / 22 */
    RLX_Q5_1 = 9,  /* 32 / 24 */
    RLX_Q2_K = 10, /* 256 / 84 */
    RLX_Q3_K = 11, /* 256 / 110 */
    RLX_Q4_K = 12, /* 256 / 144 */
    RLX_Q5_K = 13, /* 256 / 176 */
    RLX_Q6_K = 14, /* 256 / 210 */
    RLX_DTYPE_COUNT
};

struct rlx_dtype_traits {
    const char *name;   /* "f32", "q8_0" */
    int64_t block_size; /* elements per block */
    size_t type_size;   /* bytes per block */
    bool is_float;      /* holds real numbers (f32, f16, bf16, the block types) */
    /* dst (n) f32 = the n elements at src converted exactly (integers, f16, bf16) or dequantised
     * (block types); n a whole number of blocks. */
    void (*to_f32)(float *dst, const void *src, int64_t n);
    /* dst = the n f32 values at src (whole blocks, all finite) converted: rounded to nearest even
     * (f16, bf16) or quantised as ggml does (block types; csrc/core/quantize.c). Returns -1, or the
     * first block (element, for f16 / bf16) that overflowed to inf: use rlx_quantize, which checks.
     * NULL for the dtypes that hold no real numbers (i32, u8). */
    int64_t (*from_f32)(void *dst, const float *src, int64_t n);
};

/* The traits of dt, or NULL when dt is out of range. */
const struct rlx_dtype_traits *rlx_dtype_traits(enum rlx_dtype dt);
const char *rlx_dtype_name(enum rlx_dtype dt); /* "f32"; "?" when out of range */
/* Bytes of n elements of dt. RLX_ERR_INVALID when n is negative or not a whole number of blocks,
 * RLX_ERR_RANGE when the count does not fit a size_t. */
rlx_status rlx_dtype_bytes(enum rlx_dtype dt, int64_t n, size_t *out);
/* Bytes of a tensor of dt and this shape (dims >= 0): its rows (the last dim) must hold whole
 * blocks; errors as rlx_dtype_bytes. A rank-0 tensor is one element. */
rlx_status rlx_shape_bytes(enum rlx_dtype dt, int ndim, const int64_t *shape, size_t *out);
/* Parses a dtype's name or an alias: "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16",
 * "i32"/"int32", "u8"/"uint8"/"bool", and the block types' names ("q8_0", "q4_k", ...). */
rlx_status rlx_dtype_parse(const char *name, enum rlx_dtype *out);
/* The first block of the n elements at src (whole blocks of a block type) whose f16 scale or
 * minimum is NaN or infinite (a corrupt file: every value of that block would be), or -1 when none;
 * -1 for the other dtypes. Reads only the scales. */
int64_t rlx_blocks_nonfinite(enum rlx_dtype dt, const void *src, int64_t n);
/* dst (rows, bytes of cols elements of dt) = x (rows, cols) f32 converted to dt row by row with
 * the traits' from_f32: bit for bit what gguf-py's quantize gives for f16, bf16, Q8_0, Q4_0, Q4_1,
 * Q5_0 and Q5_1, ggml's reference scale searches for the K types. RLX_ERR_SHAPE when cols is not
 * a whole number of blocks, RLX_ERR_INVALID naming the row and column of a NaN or infinity in x
 * (nothing written), RLX_ERR_RANGE naming the row and block whose f16 scale (or f16 / bf16 value)
 * would overflow (dst then holds the rows before it), RLX_ERR_DTYPE for i32 / u8. */
rlx_status rlx_quantize(enum rlx_dtype dt, const float *x, int64_t rows, int64_t cols, void *dst);

/* ---------------------------------------------------------------------------------------------
 * Symbolic dims
 *
 * A dim is an affine expression over the graph's symbols: c + sum_i coef[i] * sym[i].
 * Symbols 0..2 are predefined (BATCH, SEQ, PAST); more may be created by name. Symbols are bound
 * to values at run time, usually inferred from input shapes.
 * ------------------------------------------------------------------------------------------- */

#define RLX_MAX_DIMS   4
#define RLX_MAX_SYMS   24 /* 3 predefined + a batched plan's past of each of up to 16 sequences + spare */
#define RLX_MAX_INPUTS 6
#define RLX_NAME_MAX   96

enum { RLX_SYM_BATCH = 0, RLX_SYM_SEQ = 1, RLX_SYM_PAST = 2, RLX_SYM_FIRST_USER = 3 };

struct rlx_dim {
    int64_t c;                  /* constant term */
    int32_t coef[RLX_MAX_SYMS]; /* coefficient of each symbol */
};

/* A dim that is the constant n / the symbol s. */
struct rlx_dim rlx_dim_const(int64_t n);
struct rlx_dim rlx_dim_sym(int sym);
bool rlx_dim_is_const(const struct rlx_dim *d);
bool rlx_dim_equal(const struct rlx_dim *a, const struct rlx_dim *b);

/* ---------------------------------------------------------------------------------------------
 * Ops (append-only enum; every per-op table is static_assert'ed on RLX_OP_COUNT)
 *
 * All compute ops take and produce f32 unless stated. Shapes use the leading dims "..." freely
 * (rows = product of the leading dims) up to RLX_MAX_DIMS.
 * ------------------------------------------------------------------------------------------- */

enum rlx_op {
    RLX_OP_INPUT = 0,   /* named runtime input (any dtype) */
    RLX_OP_PARAM,       /* named weight, bound with rlx_plan_set_param (any dtype) */
    RLX_OP_MATMUL,      /* a (..., K) @ b -> (..., N); b (N, K) if trans_b else (K, N); b may be bf16 / f16
                            (then trans_b): widened exactly, accumulated in f32 */
    RLX_OP_EMBEDDING,   /* table (V, D) f32 / bf16 / f16, ids i32 (...) -> f32 (..., D); an id outside [0, V)
                            is RLX_ERR_RANGE at run */
    RLX_OP_RMSNORM,     /* x (..., D), w (D) -> x / sqrt(mean(x^2) + eps) * w */
    RLX_OP_ROPE,        /* x (S, H, D), pos i32 (S), inv_freq (D/2) -> RoPE: element i rotated with i + D/2
                            (rotate-half, Hugging Face's layout), or with attrs.interleaved element 2i with
                            2i + 1 (the layout of q / k rows that llama.cpp's converter permutes) */
    RLX_OP_SOFTMAX,     /* x (..., N) -> softmax over the last axis */
    RLX_OP_SILU,        /* x -> x * sigmoid(x) */
    RLX_OP_ADD,         /* a (...), b (suffix of a's shape) -> a + b broadcast over the leading dims */
    RLX_OP_MUL,         /* as ADD, elementwise product */
    RLX_OP_ATTENTION,   /* q (S, Hq, D) f32, k (T, Hkv, D), v (T, Hkv, D) [, mask (S, T) f32 additive or u8
                            1=attend] -> (S, Hq, D) f32; Hq % Hkv == 0; k and v f32, f16 or bf16 (one dtype):
                            the keys of positions 0..T-1, the queries at positions T-S..T-1 (T >= S, checked
                            at run) */
    RLX_OP_GATHER_LAST, /* x (S, ...) -> (1, ...): the last row along axis 0 */
    RLX_OP_CONCAT,      /* a, b -> concatenated along attrs.axis (any dtype, same dtype) */
    RLX_OP_SLICE,       /* x -> x[start : start+len] along attrs.axis (any dtype); start < 0 counts from the end */
    RLX_OP_RESHAPE,     /* x -> same data, shape attrs.shape (element counts must agree; any dtype) */
    RLX_OP_SILU_MUL,    /* fused by the compiler: silu(a) * b */
    RLX_OP_ADD_RMSNORM, /* fused by the compiler: (a, b, w) -> a + b; also writes rmsnorm(a+b)*w into
                            its companion RLX_OP_FUSED_OUT node */
    RLX_OP_FUSED_OUT,   /* fused by the compiler: a second output written by its input node's kernel */
    RLX_OP_STATE,       /* named memory that outlives a run (a KV cache), bound per run by its owner;
                            read by ops and written only by CACHE_WRITE; any dtype, dims may be symbolic */
    RLX_OP_CACHE_WRITE, /* state (T, ...), rows f32 (S, ...), pos i32 (S) -> the state itself, after
                            row pos[i] of it was set to rows[i] converted to its dtype (f32, f16 or bf16,
                            rounding to nearest even); a pos outside [0, T) is RLX_ERR_RANGE at run */
    RLX_OP_CONVERT,     /* x f32 -> attrs.dtype (f32, f16 or bf16), each value rounded to nearest even */
    RLX_OP_TOPK,        /* x f32 (..., N) -> i32 (..., attrs.k): the indices of the k largest values of each row,
                            largest first, chosen exactly as torch.topk on the CPU chooses them (ties included:
                            libstdc++'s nth_element / partial_sort over (value, index) pairs; NaN counts as the
                            largest); 1 <= k <= N */
    RLX_OP_MATMUL_ID,   /* a (S, A, K) f32 with A = 1 or n, ids i32 (S, n), w (E, N, K) -> (S, n, N): row j of token
                            s is a[s, A == 1 ? 0 : j] @ w[ids[s, j]]^T (the experts of a mixture, stacked; w of
                            any real-valued dtype, read as MATMUL reads a trans_b weight); only the experts named
                            are read; an id outside [0, E) is RLX_ERR_RANGE at run */
    RLX_OP_MOE_COMBINE, /* y (S, n, H), probs (S, E), ids i32 (S, n) -> (S, H): sum over j of w[s, j] * y[s, j],
                            in slot order, w[s, j] = probs[s, ids[s, j]], divided by the sum of the n values
                            (in slot order) when attrs.norm; an id outside [0, E) is RLX_ERR_RANGE at run */
    RLX_OP_COUNT
};

/* Attributes of an op; each op reads the fields its comment names, the rest stay zero. */
struct rlx_attrs {
    float eps;                          /* RMSNORM, ADD_RMSNORM */
    float scale;                        /* ATTENTION: scores scale (usually 1/sqrt(D)) */
    int32_t trans_b;                    /* MATMUL */
    int32_t causal;                     /* ATTENTION: key j visible to query i only if j <= P + i */
    int64_t window;                     /* ATTENTION: > 0: also require j > P + i - window */
    int32_t axis;                       /* CONCAT, SLICE (negative counts from the end) */
    int64_t start, len;                 /* SLICE */
    int32_t ndim;                       /* RESHAPE: target rank */
    struct rlx_dim shape[RLX_MAX_DIMS]; /* RESHAPE: target shape */
    int32_t dtype;                      /* CONVERT: the enum rlx_dtype to convert to */
    int32_t interleaved;                /* ROPE: rotate adjacent pairs (2i, 2i+1) */
    int32_t k;                          /* TOPK: how many indices per row */
    int32_t norm;                       /* MOE_COMBINE: renormalise the selected probabilities to sum 1 */
};

const char *rlx_op_name(enum rlx_op op); /* "matmul"; "?" when out of range */
rlx_status rlx_op_parse(const char *name, enum rlx_op *out);

/* ---------------------------------------------------------------------------------------------
 * Graph builder
 *
 * Values are node ids (>= 0). Shape inference runs as each node is added, so a bad shape is
 * reported by the call that adds the node, naming the node, its op and the shapes involved.
 * ------------------------------------------------------------------------------------------- */

struct rlx_graph;

rlx_status rlx_graph_create(struct rlx_graph **out);
void rlx_graph_free(struct rlx_graph *g);
/* Deep copy (the copy shares nothing with g). */
rlx_status rlx_graph_clone(const struct rlx_graph *g, struct rlx_graph **out);

/* The symbol with this name, created if new ("BATCH", "SEQ", "PAST" are 0..2). */
rlx_status rlx_graph_symbol(struct rlx_graph *g, const char *name, int *out_sym);
const char *rlx_graph_symbol_name(const struct rlx_graph *g, int sym); /* NULL if not defined */
int rlx_graph_symbol_count(const struct rlx_graph *g);

rlx_status rlx_graph_input(struct rlx_graph *g, const char *name, enum rlx_dtype dt, int ndim,
                           const struct rlx_dim *shape, int *out_id);
rlx_status rlx_graph_param(struct rlx_graph *g, const char *name, enum rlx_dtype dt, int ndim,
                           const struct rlx_dim *shape, int *out_id);
/* Adds a compute node. attrs may be NULL (all zero). */
rlx_status rlx_graph_op(struct rlx_graph *g, enum rlx_op op, int n_inputs, const int *inputs,
                        const struct rlx_attrs *attrs, int *out_id);
/* Marks a value as a named graph output (outputs keep the order they were marked in). */
rlx_status rlx_graph_output(struct rlx_graph *g, int id, const char *name);

int rlx_graph_node_count(const struct rlx_graph *g);
/* Inspection of a node; returns RLX_ERR_INVALID for a bad id. name may be "" for unnamed nodes. */
rlx_status rlx_graph_node_info(const struct rlx_graph *g, int id, enum rlx_op *op, enum rlx_dtype *dt, int *ndim,
                               struct rlx_dim *shape /* RLX_MAX_DIMS */, const char **name);
/* Writes a readable listing into buf (always NUL-terminated, truncated to cap); returns the
 * length the full listing needs (excluding the NUL). */
size_t rlx_graph_dump(const struct rlx_graph *g, char *buf, size_t cap);
/* Formats one dim ("SEQ+1", "4*PAST", "64") into buf. */
void rlx_dim_format(const struct rlx_graph *g, const struct rlx_dim *d, char *buf, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Devices
 *
 * A device is an open instance of a backend ("cpu", "ref", "vulkan"; "name:arg" passes arg to the
 * backend: "vulkan:1" opens Vulkan device 1, "vulkan:staging" never maps device memory). It owns
 * the memory of everything made on it: plans' arenas, weight stores, KV caches. Free it after all
 * of those. One device may be used from several threads at once (by distinct plans, stores and
 * caches).
 * ------------------------------------------------------------------------------------------- */

struct rlx_device;

/* Names of the backends compiled in that can run here, comma separated ("cpu,ref", and "vulkan" when
 * a Vulkan driver offers a device it can run on). */
const char *rlx_backends(void);
/* The devices that can be opened: per device a record of "key=value" lines (name, backend, and for
 * a GPU its name, driver, type, subgroup size, memory and limits), each record ending with an empty
 * line, into buf (NUL-terminated, truncated to cap); returns the length written. */
size_t rlx_devices_describe(char *buf, size_t cap);
/* Opens a device; RLX_ERR_INVALID naming the backends compiled in for an unknown name. */
rlx_status rlx_device_open(const char *name, struct rlx_device **out);
void rlx_device_free(struct rlx_device *d);
const char *rlx_device_name(const struct rlx_device *d);
/* "key=value" lines about the device's backend and instance into buf (NUL-terminated, truncated
 * to cap); returns the length written. */
size_t rlx_device_describe(const struct rlx_device *d, char *buf, size_t cap);

/* What crossed between host and device memory since the device was opened, and what it holds. */
struct rlx_device_stats {
    uint64_t upload_bytes, download_bytes, copy_bytes; /* host->device, device->host, device->device */
    uint64_t uploads, downloads;                       /* calls */
    size_t allocated_bytes;                            /* live device allocations */
    size_t wrapped_bytes;                              /* host memory used in place (live views) */
};
void rlx_device_stats(const struct rlx_device *d, struct rlx_device_stats *out);
/* Whether the device's kernels read host memory in place (cpu: weights and inputs are not copied);
 * false for devices with memory of their own (ref, vulkan), where every byte crosses by upload. */
bool rlx_device_zero_copy(const struct rlx_device *d);

/* ---------------------------------------------------------------------------------------------
 * Compile and run
 * ------------------------------------------------------------------------------------------- */

struct rlx_compile_opts {
    bool fuse;                     /* run the fusion pass (default true) */
    int64_t sym_cap[RLX_MAX_SYMS]; /* upper bound of each symbol: memory is planned once at the caps and
                                    a binding above a cap is RLX_ERR_RANGE; 0 = none */
    size_t memory_budget;          /* > 0: a run whose arena would exceed this many bytes is refused with
                                    RLX_ERR_NOMEM before anything is allocated; 0 = none */
    const char *budget_hint;       /* appended to that refusal (how to change the budget); may be NULL.
                                    Borrowed for the duration of rlx_compile (copied). */
    bool batch_invariant;          /* every row of a matrix product of up to RLX_INVARIANT_ROWS rows
                                    (matmul; matmul_id: an expert's rows) gets the bits that row gets
                                    in a product of its own: the backend runs it as groups of rows its
                                    kernels compute row by row (on cpu, the decode kernels; slower for
                                    batches); larger products (prompts) take the prefill kernels as
                                    always. Default false. */
};
/* The most rows of a product a batch-invariant plan keeps row by row: a decode step's (one row per
 * sequence, at most RLX_MAX_BATCH of them). */
#define RLX_INVARIANT_ROWS 16
/* Defaults: fuse on, no caps, no budget, not batch-invariant. */
struct rlx_compile_opts rlx_compile_opts_default(void);

struct rlx_plan;

/* Compiles a copy of g for a device, which the plan borrows (free the plan first). g is not
 * modified and may be freed afterwards. Fails with RLX_ERR_UNSUPPORTED naming the node if the
 * backend lacks an op. */
rlx_status rlx_compile(const struct rlx_graph *g, struct rlx_device *dev, const struct rlx_compile_opts *opts,
                       struct rlx_plan **out);
void rlx_plan_free(struct rlx_plan *p);

/* The compiled (post-pass) graph, owned by the plan. */
const struct rlx_graph *rlx_plan_graph(const struct rlx_plan *p);
struct rlx_device *rlx_plan_device(const struct rlx_plan *p);

int rlx_plan_input_count(const struct rlx_plan *p);
int rlx_plan_param_count(const struct rlx_plan *p);
int rlx_plan_output_count(const struct rlx_plan *p);
const char *rlx_plan_input_name(const struct rlx_plan *p, int i);
const char *rlx_plan_param_name(const struct rlx_plan *p, int i);
const char *rlx_plan_output_name(const struct rlx_plan *p, int i);
/* The dtype (enum rlx_dtype) of output i, known from compile on; -1 for a bad index. */
int rlx_plan_output_dtype(const struct rlx_plan *p, int i);
/* Index of a named input / param / output, or RLX_ERR_INVALID naming it. */
rlx_status rlx_plan_input_index(const struct rlx_plan *p, const char *name, int *out);
rlx_status rlx_plan_param_index(const struct rlx_plan *p, const char *name, int *out);
rlx_status rlx_plan_output_index(const struct rlx_plan *p, const char *name, int *out);

/* A host tensor handed to the core: contiguous, row-major; shape counts elements (a block type's
 * rows hold whole blocks: rlx_shape_bytes gives its size). */
struct rlx_host_tensor {
    const void *data;
    enum rlx_dtype dtype;
    int ndim;
    int64_t shape[RLX_MAX_DIMS];
};

/* Binds a weight for this plan alone. Its dtype and shape must match the param exactly (constant
 * dims). The plan keeps the pointer (zero-copy on devices that read host memory; others upload a
 * copy now) until the plan is freed or the param is set again. */
rlx_status rlx_plan_set_param(struct rlx_plan *p, int index, const struct rlx_host_tensor *t);
/* Binds an input for the next run; the pointer is kept until rlx_plan_run returns. */
rlx_status rlx_plan_set_input(struct rlx_plan *p, int index, const struct rlx_host_tensor *t);
/* Binds host memory for output i for the next run (bytes must equal the output's size for that
 * run's binding). Where the backend can wrap host memory, the kernel that makes the output writes
 * straight into dst and the value takes no arena space (e.g. new K/V rows written in place into
 * a KV cache); otherwise the output is copied there when the run ends. dst must not overlap a
 * param, another bound output, or input bytes the results depend on; after a failed run its
 * contents are undefined. The binding is cleared by run; rlx_plan_read_output of that output
 * (and of outputs aliasing it) then reads dst, which must still be alive. */
rlx_status rlx_plan_bind_output(struct rlx_plan *p, int index, void *dst, size_t bytes);
/* Binds a symbol explicitly (otherwise symbols are inferred from input shapes). Cleared by run. */
rlx_status rlx_plan_bind_symbol(struct rlx_plan *p, int sym, int64_t value);

/* Runs the plan: infers symbols from the inputs, checks every input and param is bound with a
 * fitting shape, plans memory for these sizes, executes. On error the plan stays usable. */
rlx_status rlx_plan_run(struct rlx_plan *p);

/* After a successful run: the shape of output i and a copy of its data (bytes must equal
 * numel * dtype size). */
rlx_status rlx_plan_output_shape(const struct rlx_plan *p, int i, enum rlx_dtype *dt, int *ndim,
                                 int64_t shape[RLX_MAX_DIMS]);
rlx_status rlx_plan_read_output(const struct rlx_plan *p, int i, void *dst, size_t bytes);

/* Bytes of the intermediate arena for the last run (or, before any run, for the symbol caps /
 * constant shapes; 0 if unknown), and the sum of all intermediates' sizes without reuse. */
size_t rlx_plan_planned_bytes(const struct rlx_plan *p);
size_t rlx_plan_unshared_bytes(const struct rlx_plan *p);
/* Estimated peak bytes of a run with the given symbol values (arena + workspace), without
 * running: used by callers to enforce a memory budget before they compile bigger plans. */
rlx_status rlx_plan_estimate_bytes(const struct rlx_plan *p, const int64_t sym_values[RLX_MAX_SYMS], size_t *out);

/* Profiling: when on, each run records every node's wall time; rlx_plan_profile adds them up per
 * op into seconds_by_op (RLX_OP_COUNT entries) for the last run. */
rlx_status rlx_plan_set_profiling(struct rlx_plan *p, bool on);
rlx_status rlx_plan_profile(const struct rlx_plan *p, double *seconds_by_op);

/* ---------------------------------------------------------------------------------------------
 * Weight stores
 *
 * Named weights on a device, each uploaded (or, on devices that read host memory, used in place)
 * once and shared by every plan bound to the store. A store is not safe to change from two
 * threads at once; plans bound to it may run on other threads while nobody changes it.
 * ------------------------------------------------------------------------------------------- */

struct rlx_weights;

rlx_status rlx_weights_create(struct rlx_device *dev, struct rlx_weights **out);
void rlx_weights_free(struct rlx_weights *w); /* after the plans bound to it */
/* Adds or replaces a weight. In place (zero-copy) where the device reads host memory: the memory
 * must then stay alive and unchanged as long as the store holds it; else uploaded now. A block
 * type's weight with a NaN or infinite scale is refused (RLX_ERR_INVALID naming the block). Plans bound
 * to a weight that is replaced must be bound again (or freed) before they run. */
rlx_status rlx_weights_set(struct rlx_weights *w, const char *name, const struct rlx_host_tensor *t);
/* Adds or replaces a stacked weight of shape (n, part shape...) given as n parts of one dtype and
 * shape, which need not be contiguous (a mixture's experts as a Hugging Face file holds them). On a
 * device that reads host memory every part is used in place (kept alive and unchanged as above) and
 * the weight is readable by RLX_OP_MATMUL_ID only (binding a plan that reads it otherwise fails,
 * naming the node); elsewhere the parts are uploaded into one buffer, a weight like any other. */
rlx_status rlx_weights_set_parts(struct rlx_weights *w, const char *name, int64_t n,
                                 const struct rlx_host_tensor *parts);
/* The dtype and shape of a weight; RLX_ERR_INVALID naming it when the store lacks it. */
rlx_status rlx_weights_info(const struct rlx_weights *w, const char *name, enum rlx_dtype *dt, int *ndim,
                            int64_t shape[RLX_MAX_DIMS]);
int rlx_weights_count(const struct rlx_weights *w);
size_t rlx_weights_bytes(const struct rlx_weights *w); /* sum of the weights' sizes */
/* Files that change under a loaded model. A weight used in place may be a view of a memory-mapped
 * file; rlx_weights_add_source records such a file with its identity at load (st_dev, st_ino,
 * size, mtime in ns). rlx_weights_check fails with RLX_ERR_IO naming the file when it has been
 * modified in place since (same inode, another size or mtime; a file replaced by a rename leaves
 * the mapping intact and is not an error), or when a read of a weight faulted (the file was
 * truncated: see rlx_guard_fault). The model runs it before and after every plan run. */
rlx_status rlx_weights_add_source(struct rlx_weights *w, const char *path, uint64_t dev, uint64_t ino, int64_t size,
                                  int64_t mtime_ns);
rlx_status rlx_weights_check(const struct rlx_weights *w);
/* For a SIGBUS handler (the Python binding installs one): when addr lies in a weight some store
 * uses in place, maps a page of zeros over its page, marks the store (its next check fails) and
 * returns true, so the faulting read completes; false otherwise (not rlx's: chain to the previous
 * handler). Async-signal-safe. */
bool rlx_guard_fault(void *addr);
/* Binds every param of the plan to the store's weight of the same name (no copy). Fails naming the
 * first param the store lacks or holds with another dtype or shape; the plan's earlier bindings
 * then stay as they were. */
rlx_status rlx_plan_bind_weights(struct rlx_plan *p, const struct rlx_weights *w);

/* ---------------------------------------------------------------------------------------------
 * Threads and build information
 * ------------------------------------------------------------------------------------------- */

/* Threads used by the CPU kernels and by OpenBLAS (set together, so they never oversubscribe).
 * n <= 0 restores the default (the number of online CPUs). */
void rlx_set_num_threads(int n);
int rlx_get_num_threads(void);

/* Static build facts: "key=value" lines (cc, cflags, backends, then each backend's: blas,
 * blas_config, blas_threads, isa for cpu; vulkan (the device it would open, or why none),
 * vulkan_validation, vulkan_validation_messages and vulkan_validation_last for vulkan). */
const char *rlx_build_info(void);

#ifdef __cplusplus
}
#endif
#endif

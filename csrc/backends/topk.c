/*
 * topk.c - the one definition of RLX_OP_TOPK, shared by the host tables (ref and cpu).
 *
 * The op promises the indices torch.topk returns on the CPU, ties included, because a mixture's
 * router picks its experts with torch.topk and a tie at the k-th place decides which expert runs.
 * torch (aten/src/ATen/native/TopKImpl.h) fills a vector of (value, index) pairs in index order and
 * orders it with the comparator "x before y iff x is NaN and y is not, or x > y", through
 * std::partial_sort(first, first + k, last) when k * 64 <= n, else std::nth_element(first,
 * first + k - 1, last) followed by std::sort(first, first + k - 1). Neither is stable: which of
 * equal values lands first is whatever those algorithms do, so this file is libstdc++'s algorithms
 * (bits/stl_algo.h, bits/stl_heap.h: introselect, introsort with a 16-element insertion-sort
 * threshold, heap select / sort heap), step for step, over the same comparator. Its oracle is
 * torch itself (tests/unit/test_moe_ops.py compares with torch.topk on inputs full of ties).
 * Never allocates (the pairs live in the caller's scratch), never fails.
 */
#include "backends/kernels.h"

#include <math.h>

struct pair {
    float v;
    int32_t i;
};

/* torch's "largest" comparator: x goes before y */
static inline bool before(struct pair x, struct pair y) { return (isnan(x.v) && !isnan(y.v)) || x.v > y.v; }

static inline void swap(struct pair *a, struct pair *b)
{
    struct pair t = *a;
    *a = *b;
    *b = t;
}

static int64_t lg(int64_t n) { return 63 - __builtin_clzll((unsigned long long)n); }

/* ---- heaps (stl_heap.h) ------------------------------------------------------------------- */

static void push_heap(struct pair *f, int64_t hole, int64_t top, struct pair value)
{
    int64_t parent = (hole - 1) / 2;
    while (hole > top && before(f[parent], value)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = value;
}

static void adjust_heap(struct pair *f, int64_t hole, int64_t len, struct pair value)
{
    const int64_t top = hole;
    int64_t second = hole;
    while (second < (len - 1) / 2) {
        second = 2 * (second + 1);
        if (before(f[second], f[second - 1])) second--;
        f[hole] = f[second];
        hole = second;
    }
    if ((len & 1) == 0 && second == (len - 2) / 2) {
        second = 2 * (second + 1);
        f[hole] = f[second - 1];
        hole = second - 1;
    }
    push_heap(f, hole, top, value);
}

/* the heap [f, f + len) gives up its top to *result, which moves into the heap */
static void pop_heap(struct pair *f, int64_t len, struct pair *result)
{
    struct pair value = *result;
    *result = f[0];
    adjust_heap(f, 0, len, value);
}

static void make_heap(struct pair *f, int64_t len)
{
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        adjust_heap(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}

static void heap_select(struct pair *f, int64_t middle, int64_t last)
{
    make_heap(f, middle);
    for (int64_t i = middle; i < last; i++)
        if (before(f[i], f[0])) pop_heap(f, middle, &f[i]);
}

static void sort_heap(struct pair *f, int64_t len)
{
    while (len > 1) {
        len--;
        pop_heap(f, len, &f[len]);
    }
}

static void partial_sort(struct pair *f, int64_t middle, int64_t last)
{
    heap_select(f, middle, last);
    sort_heap(f, middle);
}

/* ---- partitions and insertion sorts (stl_algo.h) ------------------------------------------ */

static void move_median_to_first(struct pair *result, struct pair *a, struct pair *b, struct pair *c)
{
    if (before(*a, *b)) {
        if (before(*b, *c))
            swap(result, b);
        else if (before(*a, *c))
            swap(result, c);
        else
            swap(result, a);
    } else if (before(*a, *c)) {
        swap(result, a);
    } else if (before(*b, *c)) {
        swap(result, c);
    } else {
        swap(result, b);
    }
}

static int64_t unguarded_partition(struct pair *f, int64_t first, int64_t last, int64_t pivot)
{
    for (;;) {
        while (before(f[first], f[pivot])) first++;
        last--;
        while (before(f[pivot], f[last])) last--;
        if (!(first < last)) return first;
        swap(&f[first], &f[last]);
        first++;
    }
}

/* the cut of [first, last): the median of three moved to first, then a partition around it */
static int64_t partition_pivot(struct pair *f, int64_t first, int64_t last)
{
    const int64_t mid = first + (last - first) / 2;
    move_median_to_first(&f[first], &f[first + 1], &f[mid], &f[last - 1]);
    return unguarded_partition(f, first + 1, last, first);
}

static void unguarded_linear_insert(struct pair *f, int64_t last)
{
    const struct pair val = f[last];
    int64_t next = last - 1;
    while (before(val, f[next])) {
        f[last] = f[next];
        last = next;
        next--;
    }
    f[last] = val;
}

static void insertion_sort(struct pair *f, int64_t first, int64_t last)
{
    if (first == last) return;
    for (int64_t i = first + 1; i != last; i++) {
        if (before(f[i], f[first])) {
            const struct pair val = f[i];
            for (int64_t j = i; j > first; j--) f[j] = f[j - 1];
            f[first] = val;
        } else {
            unguarded_linear_insert(f, i);
        }
    }
}

#define THRESHOLD 16

static void introsort_loop(struct pair *f, int64_t first, int64_t last, int64_t depth)
{
    while (last - first > THRESHOLD) {
        if (depth == 0) {
            partial_sort(f + first, last - first, last - first);
            return;
        }
        depth--;
        const int64_t cut = partition_pivot(f, first, last);
        introsort_loop(f, cut, last, depth);
        last = cut;
    }
}

static void sort(struct pair *f, int64_t n)
{
    if (n == 0) return;
    introsort_loop(f, 0, n, lg(n) * 2);
    if (n > THRESHOLD) {
        insertion_sort(f, 0, THRESHOLD);
        for (int64_t i = THRESHOLD; i != n; i++) unguarded_linear_insert(f, i);
    } else {
        insertion_sort(f, 0, n);
    }
}

static void nth_element(struct pair *f, int64_t nth, int64_t n)
{
    if (n == 0 || nth == n) return;
    int64_t first = 0, last = n, depth = lg(n) * 2;
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(f + first, nth + 1 - first, last - first);
            swap(&f[first], &f[nth]); /* the nth element into its place */
            return;
        }
        depth--;
        const int64_t cut = partition_pivot(f, first, last);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(f, first, last);
}

/* ---- the op ------------------------------------------------------------------------------- */

size_t rlx_topk_scratch(int64_t n) { return (size_t)n * (sizeof(struct pair) / sizeof(float)); }

void rlx_topk_f32(int32_t *out, const float *x, int64_t rows, int64_t n, int64_t k, float *scratch)
{
    struct pair *q = (struct pair *)(void *)scratch;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < n; j++) q[j] = (struct pair){x[r * n + j], (int32_t)j};
        if (k * 64 <= n) {
            partial_sort(q, k, n);
        } else {
            nth_element(q, k - 1, n);
            sort(q, k - 1);
        }
        for (int64_t j = 0; j < k; j++) out[r * k + j] = q[j].i;
    }
}

#version 450
// topk.comp - out (rows, k) i32 = the indices of the k largest values of each row of x (rows, n)
// f32, chosen exactly as torch.topk on the CPU chooses them, ties included: one invocation per row
// replays csrc/backends/topk.c (libstdc++'s partial_sort when k * 64 <= n, else nth_element then
// sort of the first k - 1; see there) step for step over (key, index) pairs in a scratch buffer
// (n pairs per row of this dispatch). The comparator "x before y iff x is NaN and y is not, or
// x > y" is read on integer keys: a float's bits mapped to an unsigned order (both zeros to one
// key, every NaN to the largest), so no float comparison, NaN handling or denormal flushing of
// the device can change the choice. The one recursion of the algorithms (introsort's right part)
// is a stack of pending ranges: they are disjoint, so the order they are sorted in is immaterial.
#include "common.glsl"
layout(binding = 0) readonly buffer X { uint x[]; };     // f32 bits
layout(binding = 1) writeonly buffer O { int o[]; };
layout(binding = 2) buffer Q { uvec2 q[]; };             // (rows, n) pairs (key, index)
layout(push_constant) uniform P {
    uint rows, n, k;         // rows of this dispatch, row length, indices per row
    uint x_off, o_off;       // elements
} p;

uint B;                      // this row's first pair

uint key(uint u)
{
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0xffffffffu;      // NaN: the largest
    if (a == 0u) return 0x80000000u;              // -0 == +0
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

bool before(uvec2 a, uvec2 b) { return a.x > b.x; }
uvec2 at(int i) { return q[B + uint(i)]; }
void put(int i, uvec2 v) { q[B + uint(i)] = v; }
void swp(int i, int j)
{
    uvec2 t = at(i);
    put(i, at(j));
    put(j, t);
}
int lg(int n) { return findMSB(n); }

// ---- heaps over [f, f + len) (stl_heap.h) ----
void push_heap(int f, int hole, int top, uvec2 value)
{
    int parent = (hole - 1) / 2;
    while (hole > top && before(at(f + parent), value)) {
        put(f + hole, at(f + parent));
        hole = parent;
        parent = (hole - 1) / 2;
    }
    put(f + hole, value);
}

void adjust_heap(int f, int hole, int len, uvec2 value)
{
    int top = hole, second = hole;
    while (second < (len - 1) / 2) {
        second = 2 * (second + 1);
        if (before(at(f + second), at(f + second - 1))) second--;
        put(f + hole, at(f + second));
        hole = second;
    }
    if ((len & 1) == 0 && second == (len - 2) / 2) {
        second = 2 * (second + 1);
        put(f + hole, at(f + second - 1));
        hole = second - 1;
    }
    push_heap(f, hole, top, value);
}

// the heap [f, f + len) gives up its top to pair `result`, whose value moves into the heap
void pop_heap(int f, int len, int result)
{
    uvec2 value = at(result);
    put(result, at(f));
    adjust_heap(f, 0, len, value);
}

void make_heap(int f, int len)
{
    if (len < 2) return;
    for (int parent = (len - 2) / 2;; parent--) {
        adjust_heap(f, parent, len, at(f + parent));
        if (parent == 0) return;
    }
}

void heap_select(int f, int middle, int last)
{
    make_heap(f, middle);
    for (int i = middle; i < last; i++)
        if (before(at(f + i), at(f))) pop_heap(f, middle, f + i);
}

void sort_heap(int f, int len)
{
    while (len > 1) {
        len--;
        pop_heap(f, len, f + len);
    }
}

void partial_sort(int f, int middle, int last)
{
    heap_select(f, middle, last);
    sort_heap(f, middle);
}

// ---- partitions and insertion sorts (stl_algo.h), on pairs of this row ----
void move_median_to_first(int result, int a, int b, int c)
{
    if (before(at(a), at(b))) {
        if (before(at(b), at(c))) swp(result, b);
        else if (before(at(a), at(c))) swp(result, c);
        else swp(result, a);
    } else if (before(at(a), at(c))) {
        swp(result, a);
    } else if (before(at(b), at(c))) {
        swp(result, c);
    } else {
        swp(result, b);
    }
}

int unguarded_partition(int first, int last, int pivot)
{
    for (;;) {
        while (before(at(first), at(pivot))) first++;
        last--;
        while (before(at(pivot), at(last))) last--;
        if (!(first < last)) return first;
        swp(first, last);
        first++;
    }
    return first;
}

int partition_pivot(int first, int last)
{
    int mid = first + (last - first) / 2;
    move_median_to_first(first, first + 1, mid, last - 1);
    return unguarded_partition(first + 1, last, first);
}

void unguarded_linear_insert(int last)
{
    uvec2 val = at(last);
    int next = last - 1;
    while (before(val, at(next))) {
        put(last, at(next));
        last = next;
        next--;
    }
    put(last, val);
}

void insertion_sort(int first, int last)
{
    if (first == last) return;
    for (int i = first + 1; i != last; i++) {
        if (before(at(i), at(first))) {
            uvec2 val = at(i);
            for (int j = i; j > first; j--) put(j, at(j - 1));
            put(first, val);
        } else {
            unguarded_linear_insert(i);
        }
    }
}

#define THRESHOLD 16
#define STACK 64     // pending ranges hold strictly decreasing depths <= 2 lg(n) < 64

void introsort_loop(int first0, int last0, int depth0)
{
    ivec3 stack[STACK];
    int top = 0;
    stack[top++] = ivec3(first0, last0, depth0);
    while (top > 0) {
        ivec3 s = stack[--top];
        int first = s.x, last = s.y, depth = s.z;
        while (last - first > THRESHOLD) {
            if (depth == 0) {
                partial_sort(first, last - first, last - first);
                break;
            }
            depth--;
            int cut = partition_pivot(first, last);
            stack[top++] = ivec3(cut, last, depth);   // the right part, sorted later (disjoint)
            last = cut;
        }
    }
}

void sort(int n)
{
    if (n == 0) return;
    introsort_loop(0, n, lg(n) * 2);
    if (n > THRESHOLD) {
        insertion_sort(0, THRESHOLD);
        for (int i = THRESHOLD; i != n; i++) unguarded_linear_insert(i);
    } else {
        insertion_sort(0, n);
    }
}

void nth_element(int nth, int n)
{
    if (n == 0 || nth == n) return;
    int first = 0, last = n, depth = lg(n) * 2;
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth + 1 - first, last - first);
            swp(first, nth);
            return;
        }
        depth--;
        int cut = partition_pivot(first, last);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    insertion_sort(first, last);
}

void main()
{
    uint row = group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (row >= p.rows) return;
    int n = int(p.n), k = int(p.k);
    B = row * p.n;
    for (uint j = 0u; j < p.n; j++) q[B + j] = uvec2(key(x[p.x_off + B + j]), j);
    if (p.k <= p.n / 64u) {   // k * 64 <= n
        partial_sort(0, k, n);
    } else {
        nth_element(k - 1, n);
        sort(k - 1);
    }
    for (uint j = 0u; j < p.k; j++) o[p.o_off + row * p.k + j] = int(q[B + j].y);
}

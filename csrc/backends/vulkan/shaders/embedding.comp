#version 450
// embedding.comp - out (n, d) f32 = rows ids (n) of a table (V, d) of WTYPE, widened or
// dequantised in the shader. A dispatch covers the table rows [v0, v0 + vrows) (a table bigger
// than one binding may span is bound in pieces) and ids [r0, r0 + n): ids outside the piece are
// left to another dispatch. An id outside [0, V) is reported once through the status words (the
// run then fails naming it) by the piece with v0 == 0, which writes zeros in its row.
#include "common.glsl"
#define W_BINDING 0
#include "weights.glsl"
layout(binding = 1) readonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(binding = 3) buffer Status { uint status[4]; };   // set flag, node, index, value
layout(push_constant) uniform P {
    uint n, d;               // ids in this dispatch, row length
    uint vocab, v0, vrows;   // table rows in all, the first bound here, how many are bound
    uint w_off, w_row;       // table row v0 and the stride of rows (bytes for block types, else elements)
    uint ids_off, o_off;     // elements
    uint node, r0;           // for the status report: node id, position of this dispatch's first id
    uint items;              // n * d (or n * d / 16 for block types)
} p;

void main()
{
    uint item = group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (item >= p.items) return;
#ifdef W_BLOCK
    uint per = p.d / 16u, r = item / per, c = (item % per) * 16u, width = 16u;
#else
    uint per = p.d, r = item / per, c = item % per, width = 1u;
#endif
    int id = ids[p.ids_off + r];
    if (id < 0 || uint(id) >= p.vocab) {
        if (p.v0 != 0u) return;
        for (uint j = 0u; j < width; j++) o[p.o_off + r * p.d + c + j] = 0.0;
        if (c == 0u && atomicCompSwap(status[0], 0u, 1u) == 0u) {
            status[1] = p.node;
            status[2] = p.r0 + r;
            status[3] = uint(id);
        }
        return;
    }
    if (uint(id) < p.v0 || uint(id) >= p.v0 + p.vrows) return;
    uint row = p.w_off + (uint(id) - p.v0) * p.w_row;
#ifdef W_BLOCK
    float v[16];
    deq16(row, c, v);
    for (uint j = 0u; j < 16u; j++) o[p.o_off + r * p.d + c + j] = v[j];
#else
    o[p.o_off + r * p.d + c] = load_w(row + c);
#endif
}

#version 450
// set_rows: d row ids[i] = a row i, converted (A_TYPE -> D_TYPE): the KV-cache write.
// d may be bound in windows of rows [row_lo, row_hi); ids outside the window write nothing.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer A { A_TYPE a[]; };
layout(binding = 1) readonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer D { D_TYPE d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1;
    uint i_off, i_nb0;
    uint d_off, d_nb0, d_nb1, row_lo, row_hi;
} p;

void main() {
    const uint i1 = p.o1 + gl_WorkGroupID.y;
    const int row = ids[p.i_off + i1 * p.i_nb0];
    if (row < int(p.row_lo) || row >= int(p.row_hi)) {
        return;
    }
    const uint a_row = p.a_off + i1 * p.a_nb1;
    const uint d_row = p.d_off + (uint(row) - p.row_lo) * p.d_nb1;
    for (uint i0 = gl_GlobalInvocationID.x; i0 < p.ne0; i0 += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        d[d_row + i0 * p.d_nb0] = TO_D(float(a[a_row + i0 * p.a_nb0]));
    }
}

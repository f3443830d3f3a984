#version 450
// get_rows: d[i3, i2, i1, :] = float(a[i3, i2, ids[i3, i2, i1], :]) for weights of any supported type.
// When a is too large for one binding, it is bound in windows of rows [row_lo, row_hi) and each
// dispatch copies only the ids that fall in its window. Ids outside a's rows write nothing.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 128) in;
layout(binding = 1) readonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer D { float d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint i_off, i_nb0, i_nb1, i_nb2;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    uint row_lo, row_hi;
} p;

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const int id = ids[p.i_off + r.x * p.i_nb0 + r.y * p.i_nb1 + r.z * p.i_nb2];
    if (id < int(p.row_lo) || id >= int(p.row_hi)) {
        return;
    }
    const uint a_row = p.a_off + (uint(id) - p.row_lo) * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3;
    const uint d_row = p.d_off + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3;
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
#if defined(A_FLOAT)
    for (uint i0 = gl_GlobalInvocationID.x; i0 < p.ne0; i0 += stride) {
        d[d_row + i0 * p.d_nb0] = load_a(a_row + i0 * p.a_nb0);
    }
#else
    for (uint i0 = 4 * gl_GlobalInvocationID.x; i0 < p.ne0; i0 += 4 * stride) {
        const vec4 v = dequant4(a_row + (i0 / BLOCK_SIZE) * p.a_nb0, i0 % BLOCK_SIZE);
        for (uint t = 0; t < 4; ++t) {
            d[d_row + (i0 + t) * p.d_nb0] = v[t];
        }
    }
#endif
}

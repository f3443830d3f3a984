#version 450
// add and mul with ggml's repeat broadcasting: b index = a index modulo b's shape, per dim. F32.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer D { float d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint b_off, b_nb0, b_nb1, b_nb2, b_nb3;
    uint b_ne0, b_ne1, b_ne2, b_ne3;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
} p;

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint a_row = p.a_off + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3;
    const uint b_row = p.b_off + (r.x % p.b_ne1) * p.b_nb1 + (r.y % p.b_ne2) * p.b_nb2 + (r.z % p.b_ne3) * p.b_nb3;
    const uint d_row = p.d_off + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3;
    for (uint i0 = gl_GlobalInvocationID.x; i0 < p.ne0; i0 += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        const float x = a[a_row + i0 * p.a_nb0];
        const float y = b[b_row + (i0 % p.b_ne0) * p.b_nb0];
#if defined(OP_ADD)
        d[d_row + i0 * p.d_nb0] = x + y;
#elif defined(OP_MUL)
        d[d_row + i0 * p.d_nb0] = x * y;
#endif
    }
}

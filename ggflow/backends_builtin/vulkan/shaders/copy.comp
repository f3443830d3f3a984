#version 450
// cpy / cont: d = a converted between F32 and F16 (A_TYPE, D_TYPE), or copied bit for bit (RAW). Without RESHAPE a and d share a
// shape (any strides); with RESHAPE they share only the element count, matched in ggml's order
// (dim 0 fastest): d's coordinates -> flat index -> a's coordinates.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer A { A_TYPE a[]; };
layout(binding = 1) writeonly buffer D { D_TYPE d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    uint a_ne0, a_ne1, a_ne2, d_ne1, d_ne2;
} p;

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint d_row = p.d_off + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3;
#if !defined(RESHAPE)
    const uint a_row = p.a_off + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3;
#else
    const uint row_flat = ((r.z * p.d_ne2 + r.y) * p.d_ne1 + r.x) * p.ne0;
#endif
    for (uint i0 = gl_GlobalInvocationID.x; i0 < p.ne0; i0 += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
#if !defined(RESHAPE)
        const uint ai = a_row + i0 * p.a_nb0;
#else
        uint idx = row_flat + i0;
        const uint j0 = idx % p.a_ne0; idx /= p.a_ne0;
        const uint j1 = idx % p.a_ne1; idx /= p.a_ne1;
        const uint j2 = idx % p.a_ne2;
        const uint j3 = idx / p.a_ne2;
        const uint ai = p.a_off + j0 * p.a_nb0 + j1 * p.a_nb1 + j2 * p.a_nb2 + j3 * p.a_nb3;
#endif
#if defined(RAW)
        d[d_row + i0 * p.d_nb0] = a[ai];   // bits as they are (quantized blocks, read as 16-bit words)
#else
        d[d_row + i0 * p.d_nb0] = TO_D(float(a[ai]));
#endif
    }
}

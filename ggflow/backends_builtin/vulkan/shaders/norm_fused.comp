#version 450
// rms_norm chains in one dispatch (fusion.py), one workgroup per row, F32, rows contiguous:
//   rms_norm -> mul(., w):              y = x / sqrt(mean(x^2) + eps), z = y * w
//   add(a, b) -> rms_norm -> mul(., w): x = a + b first, written to s (ADD_FIRST)
// Every node's result is written (another node may read it), each as norm.comp and binary.comp compute
// it, so the results are the unfused dispatches' bit for bit. Each invocation reads and writes the same
// elements in every pass, so an output may alias an input exactly (fusion.py declines other overlaps).
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x = 128) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) writeonly buffer D { float d[]; };
layout(binding = 2) readonly buffer W { float w[]; };
layout(binding = 3) writeonly buffer Z { float z[]; };
#if defined(ADD_FIRST)
layout(binding = 4) readonly buffer B { float b[]; };
layout(binding = 5) buffer S { float s[]; };
#endif

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb1, a_nb2, a_nb3;
    uint d_off, d_nb1, d_nb2, d_nb3;
    uint w_off;
    uint z_off, z_nb1, z_nb2, z_nb3;
    uint b_off, b_nb1, b_nb2, b_nb3;
    uint s_off, s_nb1, s_nb2, s_nb3;
    float eps;
} p;

uint row(uint off, uint nb1, uint nb2, uint nb3, uvec3 r) {
    return off + r.x * nb1 + r.y * nb2 + r.z * nb3;
}

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint a_row = row(p.a_off, p.a_nb1, p.a_nb2, p.a_nb3, r);
    const uint d_row = row(p.d_off, p.d_nb1, p.d_nb2, p.d_nb3, r);
    const uint z_row = row(p.z_off, p.z_nb1, p.z_nb2, p.z_nb3, r);
    const uint t = gl_LocalInvocationID.x;
#if defined(ADD_FIRST)
    const uint b_row = row(p.b_off, p.b_nb1, p.b_nb2, p.b_nb3, r);
    const uint x_row = row(p.s_off, p.s_nb1, p.s_nb2, p.s_nb3, r);
#define X s
#else
    const uint x_row = a_row;
#define X a
#endif
    float squares = 0.0;
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
#if defined(ADD_FIRST)
        const float x = a[a_row + i] + b[b_row + i];
        s[x_row + i] = x;
#else
        const float x = a[a_row + i];
#endif
        squares += x * x;
    }
    const float scale = 1.0 / sqrt(workgroup_sum(squares) / float(p.ne0) + p.eps);
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
        const float y = (X[x_row + i] - 0.0) * scale;
        d[d_row + i] = y;
        z[z_row + i] = y * w[p.w_off + i];
    }
}

#version 450
// soft_max(x * scale + mask) over each row, one workgroup per row, F32 in and out.
// The mask (F32 or F16: M_TYPE) row is the row's index in dim 1, repeated over dims 2 and 3.
// A row masked everywhere gives NaN, as in ggml.
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x = 128) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer M { M_TYPE m[]; };
layout(binding = 2) buffer D { float d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint m_off, m_nb0, m_nb1, m_nb2, m_nb3, m_ne2, m_ne3, has_mask;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    float scale;
} p;

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint a_row = p.a_off + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3;
    const uint m_row = p.m_off + r.x * p.m_nb1 + (r.y % p.m_ne2) * p.m_nb2 + (r.z % p.m_ne3) * p.m_nb3;
    const uint d_row = p.d_off + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3;
    const uint t = gl_LocalInvocationID.x;

    float row_max = -1.0 / 0.0;
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
        float w = a[a_row + i * p.a_nb0] * p.scale;
        if (p.has_mask != 0) w += float(m[m_row + i * p.m_nb0]);
        d[d_row + i * p.d_nb0] = w;
        row_max = max(row_max, w);
    }
    row_max = workgroup_max(row_max);
    float sum = 0.0;
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {  // each thread rereads only what it wrote
        const float e = exp(d[d_row + i * p.d_nb0] - row_max);
        d[d_row + i * p.d_nb0] = e;
        sum += e;
    }
    const float inverse = 1.0 / workgroup_sum(sum);
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
        d[d_row + i * p.d_nb0] *= inverse;
    }
}

#version 450
// rms_norm (RMS) and norm over each row, one workgroup per row, F32.
//   rms_norm: y = x / sqrt(mean(x^2) + eps);  norm: y = (x - mean) / sqrt(var + eps)
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x = 128) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) writeonly buffer D { float d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    float eps;
} p;

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint a_row = p.a_off + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3;
    const uint d_row = p.d_off + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3;
    const uint t = gl_LocalInvocationID.x;
#if defined(RMS)
    const float mean = 0.0;
    float squares = 0.0;
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
        const float x = a[a_row + i * p.a_nb0];
        squares += x * x;
    }
#else
    float sum = 0.0;
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
        sum += a[a_row + i * p.a_nb0];
    }
    const float mean = workgroup_sum(sum) / float(p.ne0);
    float squares = 0.0;
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
        const float x = a[a_row + i * p.a_nb0] - mean;
        squares += x * x;
    }
#endif
    const float scale = 1.0 / sqrt(workgroup_sum(squares) / float(p.ne0) + p.eps);
    for (uint i = t; i < p.ne0; i += gl_WorkGroupSize.x) {
        d[d_row + i * p.d_nb0] = (a[a_row + i * p.a_nb0] - mean) * scale;
    }
}

#version 450
// scale (x * s + bias), silu, gelu: F32 or F16 in and out (A_TYPE, D_TYPE), computed in F32.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer A { A_TYPE a[]; };
layout(binding = 1) writeonly buffer D { D_TYPE d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    float param0, param1;
} p;

const float GELU_COEF_A = 0.044715;
const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876;

float op(float x) {
#if defined(OP_SCALE)
    return fma(x, p.param0, p.param1);
#elif defined(OP_SILU)
    return x / (1.0 + exp(-x));
#elif defined(OP_GELU)
    // ggml's CPU gelu: a table of F16 answers indexed by x rounded to F16 (see ops_elementwise.py).
    if (x >= 10.0) return x;
    if (x <= -10.0) return 0.0;
    const float h = round_f16(x);
    // tanh saturates long before 15; clamping keeps exp-based tanh implementations from inf/inf.
    const float inner = clamp(SQRT_2_OVER_PI * h * (1.0 + GELU_COEF_A * h * h), -15.0, 15.0);
    return round_f16(0.5 * h * (1.0 + tanh(inner)));
#endif
}

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint a_row = p.a_off + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3;
    const uint d_row = p.d_off + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3;
    for (uint i0 = gl_GlobalInvocationID.x; i0 < p.ne0; i0 += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        d[d_row + i0 * p.d_nb0] = TO_D(op(float(a[a_row + i0 * p.a_nb0])));
    }
}

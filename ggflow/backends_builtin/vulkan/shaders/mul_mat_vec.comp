#version 450
// mul_mat for few columns of b (decode): one workgroup per element of d, threads split the dot over k.
#include "common.glsl"
#include "dequant.glsl"
#include "reduce.glsl"
#include "matmul_common.glsl"

layout(local_size_x = 128) in;

void main() {
    const uint i = p.o0 + gl_WorkGroupID.x, j = p.o1 + gl_WorkGroupID.y;
    const uint i2 = batch2(), i3 = batch3();
    const uint a_row = p.a_off + i * p.a_nb1 + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
    const uint b_row = p.b_off + j * p.b_nb1 + i2 * p.b_nb2 + i3 * p.b_nb3;
    const uint t = gl_LocalInvocationID.x, threads = gl_WorkGroupSize.x;
    float acc = 0.0;
#if defined(A_FLOAT)
    for (uint k = t; k < p.K; k += threads) {
        acc += load_a(a_row + k * p.a_nb0) * load_b(b_row + k * p.b_nb0);
    }
#else
    for (uint k = 4 * t; k < p.K; k += 4 * threads) {
        const vec4 w = dequant4(a_row + (k / BLOCK_SIZE) * p.a_nb0, k % BLOCK_SIZE);
        const uint bk = b_row + k * p.b_nb0;
        acc += dot(w, vec4(b[bk], b[bk + p.b_nb0], b[bk + 2 * p.b_nb0], b[bk + 3 * p.b_nb0]));
    }
#endif
    acc = workgroup_sum(acc);
    if (t == 0) {
        d[p.d_off + i * p.d_nb0 + j * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = acc;
    }
}

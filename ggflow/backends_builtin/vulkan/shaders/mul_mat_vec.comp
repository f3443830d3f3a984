#version 450
// mul_mat for few columns of b (decode). Each subgroup computes whole elements of d, NR rows of a at a
// time: its lanes split the dots over k, each value of b read once for the NR rows (a quantized row reads
// 16 bytes of b per 2 bytes of Q4_0 otherwise), and one subgroupAdd per row sums them, with no shared
// memory and no barrier. A workgroup covers p.rows_per_group rows of a (the host's guess of how many
// subgroups it holds, times NR: ops_matmul.VEC_ROWS_PER_SUBGROUP); its subgroups share those rows out
// whatever their actual size, so the result is right even where the driver picks another subgroup size
// than the one it reports. Each row's sum is taken in the same order as with one row at a time.
#include "common.glsl"
#include "dequant.glsl"
#include "matmul_common.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128) in;

const uint NR = 2;

void main() {
    const uint j = p.o1 + gl_WorkGroupID.y;
    const uint i2 = batch2(), i3 = batch3();
    const uint a_mat = p.a_off + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
    const uint b_row = p.b_off + j * p.b_nb1 + i2 * p.b_nb2 + i3 * p.b_nb3;
    const uint e_row = p.e_off + j * p.e_nb1 + i2 * p.e_nb2 + i3 * p.e_nb3;
    const uint first = p.o0 + gl_WorkGroupID.x * p.rows_per_group;
    const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
    for (uint r = gl_SubgroupID * NR; r < p.rows_per_group; r += gl_NumSubgroups * NR) {
        const uint i = first + r;
        if (i >= p.hi0) break;   // uniform across the subgroup
        const uint n = min(NR, min(p.rows_per_group - r, p.hi0 - i));   // rows this pass (uniform too)
        float acc[NR];
        for (uint t = 0; t < NR; ++t) acc[t] = 0.0;
#if defined(A_FLOAT)
        for (uint k = lane; k < p.K; k += lanes) {
            const float bk = load_b(b_row + k * p.b_nb0);
            for (uint t = 0; t < NR; ++t) {
                if (t < n) acc[t] += load_a(a_mat + (i + t) * p.a_nb1 + k * p.a_nb0) * bk;
            }
        }
#else
        for (uint k = 4 * lane; k < p.K; k += 4 * lanes) {
            const uint bk = b_row + k * p.b_nb0;
            const vec4 bv = vec4(b[bk], b[bk + p.b_nb0], b[bk + 2 * p.b_nb0], b[bk + 3 * p.b_nb0]);
#if defined(HAS_MIN_DELTA)
            const bool block_start = k % BLOCK_SIZE == 0;
            const float dl = block_start ? delta[e_row + k / BLOCK_SIZE] : 0.0;
#endif
            for (uint t = 0; t < NR; ++t) {
                if (t < n) {
                    const uint blk = a_mat + (i + t) * p.a_nb1 + (k / BLOCK_SIZE) * p.a_nb0;
                    acc[t] += dot(dequant4(blk, k % BLOCK_SIZE), bv);
#if defined(HAS_MIN_DELTA)
                    if (block_start) acc[t] += half_at(blk, 1) * dl;
#endif
                }
            }
        }
#endif
        for (uint t = 0; t < NR; ++t) {
            const float sum = subgroupAdd(acc[t]);
            if (t < n && subgroupElect()) {
                d[p.d_off + (i + t) * p.d_nb0 + j * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = sum;
            }
        }
    }
}

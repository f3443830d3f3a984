#version 450
// mul_mat for few columns of b (decode). Each subgroup computes whole elements of d: its lanes split the
// dot over k and one subgroupAdd sums them, with no shared memory and no barrier. A workgroup covers
// p.rows_per_group rows of a (the host's guess of how many subgroups it holds); its subgroups share those
// rows out whatever their actual size, so the result is right even where the driver picks another
// subgroup size than the one it reports.
#include "common.glsl"
#include "dequant.glsl"
#include "matmul_common.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128) in;

float dot_row(uint a_row, uint b_row, uint e_row) {
    const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
    float acc = 0.0;
#if defined(A_FLOAT)
    for (uint k = lane; k < p.K; k += lanes) {
        acc += load_a(a_row + k * p.a_nb0) * load_b(b_row + k * p.b_nb0);
    }
#else
    for (uint k = 4 * lane; k < p.K; k += 4 * lanes) {
        const uint blk = a_row + (k / BLOCK_SIZE) * p.a_nb0;
        const vec4 w = dequant4(blk, k % BLOCK_SIZE);
        const uint bk = b_row + k * p.b_nb0;
        acc += dot(w, vec4(b[bk], b[bk + p.b_nb0], b[bk + 2 * p.b_nb0], b[bk + 3 * p.b_nb0]));
#if defined(HAS_MIN_DELTA)
        if (k % BLOCK_SIZE == 0) acc += half_at(blk, 1) * delta[e_row + k / BLOCK_SIZE];
#endif
    }
#endif
    return subgroupAdd(acc);
}

void main() {
    const uint j = p.o1 + gl_WorkGroupID.y;
    const uint i2 = batch2(), i3 = batch3();
    const uint a_mat = p.a_off + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
    const uint b_row = p.b_off + j * p.b_nb1 + i2 * p.b_nb2 + i3 * p.b_nb3;
    const uint e_row = p.e_off + j * p.e_nb1 + i2 * p.e_nb2 + i3 * p.e_nb3;
    const uint first = p.o0 + gl_WorkGroupID.x * p.rows_per_group;
    for (uint r = gl_SubgroupID; r < p.rows_per_group; r += gl_NumSubgroups) {
        const uint i = first + r;
        if (i >= p.hi0) break;   // uniform across the subgroup
        const float sum = dot_row(a_mat + i * p.a_nb1, b_row, e_row);
        if (subgroupElect()) {
            d[p.d_off + i * p.d_nb0 + j * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = sum;
        }
    }
}

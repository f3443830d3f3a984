#version 450
// mul_mat for many columns of b (prompt processing): each workgroup computes a 64 x 64 tile of d,
// 16 x 16 threads with 4 x 4 results each, staging 16-deep slices of a and b in shared memory.
#include "common.glsl"
#include "dequant.glsl"
#include "matmul_common.glsl"

layout(local_size_x = 256) in;
const uint BM = 64, BN = 64, BK = 16;
shared float As[BK * BM];
shared float Bs[BK * BN];
#if defined(HAS_MIN_DELTA)
shared float Ms[BM], Ds[BN];   // per block: the rows' minimums, the columns' deltas
#endif

void main() {
    const uint t = gl_LocalInvocationID.x, tx = t % 16, ty = t / 16;
    const uint m0 = p.o0 + gl_WorkGroupID.x * BM, n0 = p.o1 + gl_WorkGroupID.y * BN;
    const uint i2 = batch2(), i3 = batch3();
    const uint a_mat = p.a_off + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
    const uint b_mat = p.b_off + i2 * p.b_nb2 + i3 * p.b_nb3;
    const uint e_mat = p.e_off + i2 * p.e_nb2 + i3 * p.e_nb3;
    // each thread stages 4 consecutive k of one row of a and of one column of b
    const uint lr = t / 4, lk = (t % 4) * 4;
    const uint m = m0 + lr, n = n0 + lr;

    float acc[4][4];
    for (uint r = 0; r < 4; ++r) for (uint c = 0; c < 4; ++c) acc[r][c] = 0.0;

    for (uint k0 = 0; k0 < p.K; k0 += BK) {
        vec4 w = vec4(0.0);
        if (m < p.hi0) {
#if defined(A_FLOAT)
            for (uint q = 0; q < 4; ++q) {
                const uint k = k0 + lk + q;
                w[q] = k < p.K ? load_a(a_mat + m * p.a_nb1 + k * p.a_nb0) : 0.0;
            }
#else
            const uint k = k0 + lk;  // K is a multiple of the block size, itself a multiple of BK
            w = dequant4(a_mat + m * p.a_nb1 + (k / BLOCK_SIZE) * p.a_nb0, k % BLOCK_SIZE);
#endif
        }
        for (uint q = 0; q < 4; ++q) {
            const uint k = k0 + lk + q;
            As[(lk + q) * BM + lr] = w[q];
            Bs[(lk + q) * BN + lr] = (n < p.hi1 && k < p.K) ? load_b(b_mat + n * p.b_nb1 + k * p.b_nb0) : 0.0;
        }
#if defined(HAS_MIN_DELTA)
        const bool block_start = k0 % BLOCK_SIZE == 0;
        if (block_start && lk == 0) {
            Ms[lr] = m < p.hi0 ? half_at(a_mat + m * p.a_nb1 + (k0 / BLOCK_SIZE) * p.a_nb0, 1) : 0.0;
            Ds[lr] = n < p.hi1 ? delta[e_mat + n * p.e_nb1 + k0 / BLOCK_SIZE] : 0.0;
        }
#endif
        barrier();
#if defined(HAS_MIN_DELTA)
        if (block_start) {
            for (uint r = 0; r < 4; ++r) for (uint c = 0; c < 4; ++c) acc[r][c] += Ms[tx + 16 * r] * Ds[ty + 16 * c];
        }
#endif
        for (uint kk = 0; kk < BK; ++kk) {
            float av[4], bv[4];
            for (uint r = 0; r < 4; ++r) av[r] = As[kk * BM + tx + 16 * r];
            for (uint c = 0; c < 4; ++c) bv[c] = Bs[kk * BN + ty + 16 * c];
            for (uint r = 0; r < 4; ++r) for (uint c = 0; c < 4; ++c) acc[r][c] = fma(av[r], bv[c], acc[r][c]);
        }
        barrier();
    }
    for (uint r = 0; r < 4; ++r) {
        for (uint c = 0; c < 4; ++c) {
            const uint i = m0 + tx + 16 * r, j = n0 + ty + 16 * c;
            if (i < p.hi0 && j < p.hi1) {
                d[p.d_off + i * p.d_nb0 + j * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = acc[r][c];
            }
        }
    }
}

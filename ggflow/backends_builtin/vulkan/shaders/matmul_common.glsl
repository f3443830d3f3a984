// mul_mat's push constants and addressing, shared by the matrix-vector and the tiled kernels.
// d[i3, i2, j, i] = dot(a row i of matrix (i2 / r2, i3 / r3), b row j of matrix (i2, i3)): a's
// matrices broadcast over b's (GQA). The box [o0, hi0) x [o1, hi1) x dims 2, 3 is this dispatch's
// part of d. b is F32; for F16 weights it is rounded to F16, as ggml's F16 vec_dot does: as it is read
// (attention over an F16 cache), or ahead by round_act (B_ROUNDED: a model's F16 weights, which read each
// value once per row). Quantized weights read b already rounded to their vec_dot_type by round_act.
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer D { float d[]; };
#if defined(A_Q4_1) || defined(A_Q5_1)
// Per block of b: ggml's Q8_1 sum s minus the sum of b's rounded values (round_act), which the weight's
// block minimum multiplies: with it the dot is ggml's d_a d_b sum(q_a q_b) + m_a s_b.
#define HAS_MIN_DELTA
layout(binding = 3) readonly buffer E { float delta[]; };
#endif

layout(push_constant) uniform Push {
    uint K, o0, hi0, o1, hi1, o2, o3, box2, r2, r3;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint b_off, b_nb0, b_nb1, b_nb2, b_nb3;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    uint rows_per_group;   // mul_mat_vec only
    uint e_off, e_nb1, e_nb2, e_nb3;
} p;

float load_b(uint i) {
#if defined(A_F16) && !defined(B_ROUNDED)
    return round_f16(b[i]);
#else
    return b[i];
#endif
}

uint batch2() { return p.o2 + gl_WorkGroupID.z % p.box2; }
uint batch3() { return p.o3 + gl_WorkGroupID.z / p.box2; }

#version 450
// RoPE, normal (NEOX undefined: pairs x[2k], x[2k+1]) or neox mode (pairs x[k], x[k + n_dims/2]),
// with freq_factors and YaRN, as ggml computes it (see ggflow's CPU kernels_rope.py).
// One workgroup per (head, token); thread t turns pair t, or copies two channels past n_dims.
#include "common.glsl"
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { A_TYPE a[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer FF { float ff[]; };
layout(binding = 3) writeonly buffer D { D_TYPE d[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    uint pos_off, ff_off, has_ff, n_dims;
    float theta_scale, freq_scale, ext_factor, attn_factor, corr_low, corr_high, yarn_mscale;
} p;

// cos and sin after reducing the angle mod 2*pi in two steps (Cody-Waite), so large positions keep
// their precision on GPUs whose cos/sin are accurate only near zero.
const float INV_TWO_PI = 0.15915494309189535;
const float TWO_PI_HI = 6.28125;                  // few mantissa bits: k * TWO_PI_HI is exact
const float TWO_PI_LO = 1.9353071795864769253e-3;

vec2 cos_sin(float angle) {
    precise float k = round(angle * INV_TWO_PI);
    precise float reduced = fma(-k, TWO_PI_LO, angle - k * TWO_PI_HI);
    return vec2(cos(reduced), sin(reduced));
}

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint a_row = p.a_off + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3;
    const uint d_row = p.d_off + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3;
    const uint half_dims = p.n_dims / 2;
    for (uint k = gl_LocalInvocationID.x; k < p.ne0 / 2; k += gl_WorkGroupSize.x) {
        if (k >= half_dims) {  // channels past n_dims pass through
            const uint i = p.n_dims + 2 * (k - half_dims);
            d[d_row + i * p.d_nb0] = TO_D(float(a[a_row + i * p.a_nb0]));
            d[d_row + (i + 1) * p.d_nb0] = TO_D(float(a[a_row + (i + 1) * p.a_nb0]));
            continue;
        }
        // theta_k = pos * theta_scale^k by repeated multiplication, exactly as ggml builds it
        precise float theta = float(pos[p.pos_off + r.y]);
        for (uint j = 0; j < k; ++j) {
            theta = theta * p.theta_scale;
        }
        // divisions correctly rounded (div_rn) as the CPU's: at position 2000 an ulp of the angle moves the
        // result by 1e-4 of |x|, and NVIDIA's division can be ulps off
        const float extrap = p.has_ff != 0 ? div_rn(theta, ff[p.ff_off + k]) : theta;
        const float interp = p.freq_scale * extrap;
        float angle = interp, mscale = p.attn_factor;
        if (p.ext_factor != 0.0) {
            const float ramp = 1.0 - min(1.0, max(0.0, div_rn(float(k) - p.corr_low,
                                                             max(0.001, p.corr_high - p.corr_low))));
            const float mix = ramp * p.ext_factor;
            angle = interp * (1.0 - mix) + extrap * mix;
            mscale = p.yarn_mscale;
        }
        const vec2 cs = cos_sin(angle) * mscale;
#if defined(NEOX)
        const uint i0 = k, i1 = k + half_dims;
#else
        const uint i0 = 2 * k, i1 = 2 * k + 1;
#endif
        const float x0 = float(a[a_row + i0 * p.a_nb0]), x1 = float(a[a_row + i1 * p.a_nb0]);
        d[d_row + i0 * p.d_nb0] = TO_D(x0 * cs.x - x1 * cs.y);
        d[d_row + i1 * p.d_nb0] = TO_D(x0 * cs.y + x1 * cs.x);
    }
}

#version 450
// Activations rounded as ggml rounds them for a dot with a quantized weight: quantized to the weight's
// vec_dot_type and dequantized again, into a contiguous F32 scratch the matmul then reads.
//   Q8_0 (and Q8_1, same values): per 32: d = amax / 127, q = roundf(x / d), x' = f16(d) * q
//   Q8_1 also writes, per block, delta = s - sum(x') with ggml's s = f16(d * sum(q)): Q4_1 and Q5_1
//         multiply their block minimum by s, and the matmul adds min * delta to get the same
//   Q8_K: per 256: the value of largest |x| (first on ties) sets iscale = -127 / max,
//         q = min(127, nearest(iscale * x)), x' = (1 / iscale) * q
//   F16:  x' = f16(x) (an F16 weight's vec_dot_type), once per activation instead of once per weight row
#include "common.glsl"
#include "exact.glsl"

layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) writeonly buffer D { float d[]; };
#if defined(ROUND_Q8_1)
layout(binding = 2) writeonly buffer E { float delta[]; };
#endif

layout(push_constant) uniform Push {
    uint K, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
    uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
    uint e_off, e_nb1, e_nb2, e_nb3;
} p;

#if defined(ROUND_Q8_0) || defined(ROUND_Q8_1)
const uint BLOCK = 32;
#else
const uint BLOCK = 256;
#endif
shared float amax_s[256];
shared uint where_s[256];

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint t = gl_LocalInvocationID.x, i0 = gl_WorkGroupID.x * 256 + t;
    const float x = i0 < p.K ? a[p.a_off + i0 * p.a_nb0 + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3] : 0.0;
    float value;
#if defined(ROUND_F16)
    value = round_f16(x);
#else
    // largest |x| of the block, and where it is (the first, as ggml's scan keeps the first)
    amax_s[t] = abs(x);
    where_s[t] = t;
    barrier();
    for (uint s = BLOCK / 2; s > 0; s >>= 1) {
        if (t % BLOCK < s) {
            const float other = amax_s[t + s];
            if (other > amax_s[t]) {
                amax_s[t] = other;
                where_s[t] = where_s[t + s];
            }
        }
        barrier();
    }
    const uint first = t - t % BLOCK;
    const float amax = amax_s[first];
#if defined(ROUND_Q8_0) || defined(ROUND_Q8_1)
    const float dq = div_rn(amax, 127.0);
    const float id = dq != 0.0 ? div_rn(1.0, dq) : 0.0;
    const float q = round_half_away(x * id);
    value = round_f16(dq) * q;
#if defined(ROUND_Q8_1)
    barrier();   // every invocation has read amax_s[first]: reuse it to sum the block's q
    amax_s[t] = q;
    barrier();
    for (uint s = BLOCK / 2; s > 0; s >>= 1) {
        if (t % BLOCK < s) amax_s[t] += amax_s[t + s];
        barrier();
    }
    if (t % BLOCK == 0 && i0 < p.K) {
        const float sum_q = amax_s[t];   // an integer below 2**24: exact
        precise float s_ggml = round_f16(sum_q * dq);
        precise float block_delta = s_ggml - round_f16(dq) * sum_q;
        delta[p.e_off + i0 / BLOCK + r.x * p.e_nb1 + r.y * p.e_nb2 + r.z * p.e_nb3] = block_delta;
    }
#endif
#else
    if (amax == 0.0) {
        value = 0.0;
    } else {
        const uint w = gl_WorkGroupID.x * 256 + where_s[first];
        const float vmax = a[p.a_off + w * p.a_nb0 + r.x * p.a_nb1 + r.y * p.a_nb2 + r.z * p.a_nb3];
        const float iscale = div_rn(-127.0, vmax);
        value = div_rn(1.0, iscale) * min(127.0, roundEven(iscale * x));
    }
#endif
#endif
    if (i0 < p.K) {
        d[p.d_off + i0 * p.d_nb0 + r.x * p.d_nb1 + r.y * p.d_nb2 + r.z * p.d_nb3] = value;
    }
}

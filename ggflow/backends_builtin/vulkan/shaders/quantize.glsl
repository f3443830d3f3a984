// (needs exact.glsl) Writing F32 values as blocks of a legacy quantized type at binding D_BINDING, bit for bit as ggml's
// quantize_row_*_ref (and so as the CPU backend) writes them. One invocation quantizes one block of 32.
// load_x(i) gives the block's i-th value. "precise" keeps each product and sum rounded as in C.

layout(binding = D_BINDING) writeonly buffer DB { uint8_t db[]; };
layout(binding = D_BINDING) writeonly buffer DH { float16_t dh[]; };

float load_x(uint i);

// round_f16 first: the conversion of an exact half is exact, whatever rounding mode the driver's has
void put_half(uint byte_offset, float v) { dh[byte_offset / 2] = float16_t(round_f16(v)); }

#if defined(D_Q8_0)
const uint D_BLOCK_BYTES = 34;
void quantize_block(uint dst) {
    float amax = 0.0;
    for (uint j = 0; j < 32; ++j) amax = max(amax, abs(load_x(j)));
    const float d = div_rn(amax, 127.0);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    put_half(dst, d);
    for (uint j = 0; j < 32; ++j) {
        precise float v = load_x(j) * id;
        db[dst + 2 + j] = uint8_t(int(round_half_away(v)) & 0xFF);
    }
}
#elif defined(D_Q4_0) || defined(D_Q5_0)
#if defined(D_Q4_0)
const uint D_BLOCK_BYTES = 18;
const float DIVISOR = -8.0, OFFSET = 8.5;
const int TOP = 15;
#else
const uint D_BLOCK_BYTES = 22;
const float DIVISOR = -16.0, OFFSET = 16.5;
const int TOP = 31;
#endif
void quantize_block(uint dst) {
    float amax = 0.0, vmax = 0.0;   // the value of largest magnitude, the first one on ties
    for (uint j = 0; j < 32; ++j) {
        const float v = load_x(j);
        if (amax < abs(v)) {
            amax = abs(v);
            vmax = v;
        }
    }
    const float d = div_rn(vmax, DIVISOR);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    put_half(dst, d);
    uint qh = 0;
    for (uint j = 0; j < 16; ++j) {
        precise float x0 = load_x(j) * id;
        precise float x1 = load_x(j + 16) * id;
        precise float s0 = x0 + OFFSET;
        precise float s1 = x1 + OFFSET;
        const uint q0 = uint(min(TOP, int(s0))), q1 = uint(min(TOP, int(s1)));
#if defined(D_Q4_0)
        db[dst + 2 + j] = uint8_t(q0 | (q1 << 4));
#else
        db[dst + 6 + j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
        qh |= ((q0 >> 4) & 1) << j;
        qh |= ((q1 >> 4) & 1) << (j + 16);
#endif
    }
#if defined(D_Q5_0)
    for (uint b = 0; b < 4; ++b) db[dst + 2 + b] = uint8_t((qh >> (8 * b)) & 0xFF);
#endif
}
#elif defined(D_Q4_1) || defined(D_Q5_1)
#if defined(D_Q4_1)
const uint D_BLOCK_BYTES = 20;
const float LEVELS = 15.0;
#else
const uint D_BLOCK_BYTES = 24;
const float LEVELS = 31.0;
#endif
void quantize_block(uint dst) {
    float lo = 3.402823466e+38, hi = -3.402823466e+38;
    for (uint j = 0; j < 32; ++j) {   // strict comparisons as ggml's: they decide the sign of a zero
        const float v = load_x(j);
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    precise float range = hi - lo;
    const float d = div_rn(range, LEVELS);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    put_half(dst, d);
    put_half(dst + 2, lo);
    uint qh = 0;
    for (uint j = 0; j < 16; ++j) {
        precise float x0 = (load_x(j) - lo) * id;
        precise float x1 = (load_x(j + 16) - lo) * id;
        precise float s0 = x0 + 0.5;
        precise float s1 = x1 + 0.5;
#if defined(D_Q4_1)
        const uint q0 = uint(min(15, int(s0))), q1 = uint(min(15, int(s1)));
        db[dst + 4 + j] = uint8_t(q0 | (q1 << 4));
#else
        const uint q0 = uint(int(s0)) & 0xFF, q1 = uint(int(s1)) & 0xFF;
        db[dst + 8 + j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
        qh |= ((q0 >> 4) & 1) << j;
        qh |= ((q1 >> 4) & 1) << (j + 16);
#endif
    }
#if defined(D_Q5_1)
    for (uint b = 0; b < 4; ++b) db[dst + 4 + b] = uint8_t((qh >> (8 * b)) & 0xFF);
#endif
}
#endif

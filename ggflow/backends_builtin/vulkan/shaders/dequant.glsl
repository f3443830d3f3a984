// Reading weights of every supported type at binding 0, as float.
//
// Float weights (A_FLOAT; A_TYPE float or float16_t) are read element by element with any stride.
// Quantized weights are read as GGUF stores them: blocks of BLOCK_SIZE elements in BLOCK_WORDS 16-bit
// words (every ggml block size is even), aliased as bytes and halves. dequant4(blk, i) gives elements
// i..i+3 (i a multiple of 4) of the block starting at word blk, following ggml's dequantize_row_*.

#if defined(A_FLOAT)
layout(binding = 0) readonly buffer AF { A_TYPE af[]; };
float load_a(uint i) { return float(af[i]); }
#else
layout(binding = 0) readonly buffer AW { uint16_t aw[]; };
layout(binding = 0) readonly buffer AB { uint8_t ab[]; };
layout(binding = 0) readonly buffer AS { int8_t as8[]; };
layout(binding = 0) readonly buffer AH { float16_t ah[]; };

uint byte_at(uint blk, uint b) { return uint(ab[2 * blk + b]); }
// Four bytes from an even byte offset, as one little-endian word.
uint word4_at(uint blk, uint b) { return uint(aw[blk + b / 2]) | (uint(aw[blk + b / 2 + 1]) << 16); }
float half_at(uint blk, uint word) { return float(ah[blk + word]); }
vec4 bytes4(uint w) { return vec4(uvec4(w, w >> 8, w >> 16, w >> 24) & 0xFFu); }
vec4 nibbles(uint w, uint shift) { return bytes4((w >> shift) & 0x0F0F0F0Fu); }
#endif

#if defined(A_Q4_0)
const uint BLOCK_SIZE = 32, BLOCK_WORDS = 9;
vec4 dequant4(uint blk, uint i) {
    const float d = half_at(blk, 0);
    return (nibbles(word4_at(blk, 2 + i % 16), i < 16 ? 0 : 4) - 8.0) * d;
}
#elif defined(A_Q4_1)
const uint BLOCK_SIZE = 32, BLOCK_WORDS = 10;
vec4 dequant4(uint blk, uint i) {
    const float d = half_at(blk, 0), m = half_at(blk, 1);
    return nibbles(word4_at(blk, 4 + i % 16), i < 16 ? 0 : 4) * d + m;
}
#elif defined(A_Q5_0) || defined(A_Q5_1)
#if defined(A_Q5_0)
const uint BLOCK_SIZE = 32, BLOCK_WORDS = 11, QH = 2, QS = 6;
#else
const uint BLOCK_SIZE = 32, BLOCK_WORDS = 12, QH = 4, QS = 8;
#endif
vec4 dequant4(uint blk, uint i) {
    const uint qh = word4_at(blk, QH);
    // the fifth bit of element i is bit i of qh, for both nibble halves
    const vec4 high = vec4(uvec4(qh >> i, qh >> (i + 1), qh >> (i + 2), qh >> (i + 3)) & 1u) * 16.0;
    const vec4 q = nibbles(word4_at(blk, QS + i % 16), i < 16 ? 0 : 4) + high;
#if defined(A_Q5_0)
    return (q - 16.0) * half_at(blk, 0);
#else
    return q * half_at(blk, 0) + half_at(blk, 1);
#endif
}
#elif defined(A_Q8_0)
const uint BLOCK_SIZE = 32, BLOCK_WORDS = 17;
vec4 dequant4(uint blk, uint i) {
    const uint b = 2 * blk + 2 + i;
    return vec4(int(as8[b]), int(as8[b + 1]), int(as8[b + 2]), int(as8[b + 3])) * half_at(blk, 0);
}
#elif defined(A_Q2_K)
// scales[16] @0, qs[64] @16, d @80, dmin @82
const uint BLOCK_SIZE = 256, BLOCK_WORDS = 42;
vec4 dequant4(uint blk, uint i) {
    const uint n = i / 128, r = i % 128, j = r / 32, l = r % 32;
    const uint sc = byte_at(blk, n * 8 + j * 2 + l / 16);
    const float dl = half_at(blk, 40) * float(sc & 0xF), ml = half_at(blk, 41) * float(sc >> 4);
    const uint q = word4_at(blk, 16 + n * 32 + l) >> (2 * j);
    return bytes4(q & 0x03030303u) * dl - ml;
}
#elif defined(A_Q3_K)
// hmask[32] @0, qs[64] @32, scales[12] @96, d @108
const uint BLOCK_SIZE = 256, BLOCK_WORDS = 55;
vec4 dequant4(uint blk, uint i) {
    const uint n = i / 128, r = i % 128, j = r / 32, l = r % 32, is = n * 8 + j * 2 + l / 16;
    // 6-bit scale is: low 4 bits from byte is % 8 (low nibble for is < 8), high 2 from byte 8 + is % 4
    const uint low = (byte_at(blk, 96 + is % 8) >> (is < 8 ? 0 : 4)) & 0xF;
    const uint high = (byte_at(blk, 96 + 8 + is % 4) >> (2 * (is / 4))) & 3;
    const float dl = half_at(blk, 54) * float(int(low | (high << 4)) - 32);
    const vec4 q = bytes4((word4_at(blk, 32 + n * 32 + l) >> (2 * j)) & 0x03030303u);
    const uint hm = word4_at(blk, l) >> (n * 4 + j);  // hmask bit (n*4+j) of bytes l..l+3
    const vec4 minus = vec4(1.0) - bytes4(hm & 0x01010101u);
    return (q - 4.0 * minus) * dl;
}
#elif defined(A_Q4_K) || defined(A_Q5_K)
// d @0, dmin @2, scales[12] @4, (Q5_K: qh[32] @16,) qs @16 / @48
#if defined(A_Q4_K)
const uint BLOCK_SIZE = 256, BLOCK_WORDS = 72, QS = 16;
#else
const uint BLOCK_SIZE = 256, BLOCK_WORDS = 88, QS = 48;
#endif
// ggml's get_scale_min_k4: 8 six-bit scales and mins packed in 12 bytes
uvec2 scale_min_k4(uint blk, uint j) {
    if (j < 4) {
        return uvec2(byte_at(blk, 4 + j) & 63, byte_at(blk, 4 + j + 4) & 63);
    }
    const uint s = byte_at(blk, 4 + j + 4);
    return uvec2((s & 0xF) | ((byte_at(blk, 4 + j - 4) >> 6) << 4), (s >> 4) | ((byte_at(blk, 4 + j) >> 6) << 4));
}
vec4 dequant4(uint blk, uint i) {
    const uint j = i / 64, r = i % 64, hi = r / 32, l = r % 32, is = 2 * j + hi;
    const uvec2 sm = scale_min_k4(blk, is);
    const float d1 = half_at(blk, 0) * float(sm.x), m1 = half_at(blk, 1) * float(sm.y);
    vec4 q = nibbles(word4_at(blk, QS + j * 32 + l), 4 * hi);
#if defined(A_Q5_K)
    q += bytes4((word4_at(blk, 16 + l) >> is) & 0x01010101u) * 16.0;
#endif
    return q * d1 - m1;
}
#elif defined(A_Q6_K)
// ql[128] @0, qh[64] @128, scales[16] (int8) @192, d @208
const uint BLOCK_SIZE = 256, BLOCK_WORDS = 105;
vec4 dequant4(uint blk, uint i) {
    const uint n = i / 128, r = i % 128, g = r / 32, l = r % 32;
    const uint ql = word4_at(blk, n * 64 + l + (g & 1) * 32) >> (4 * (g / 2));
    const uint qh = word4_at(blk, 128 + n * 32 + l) >> (2 * g);
    const vec4 q = bytes4((ql & 0x0F0F0F0Fu) | ((qh & 0x03030303u) << 4)) - 32.0;
    const float sc = float(int(as8[2 * blk + 192 + n * 8 + l / 16 + 2 * g]));
    return half_at(blk, 104) * sc * q;
}
#endif

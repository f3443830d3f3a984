#version 450
// set_rows into a quantized tensor (a quantized KV cache): d row ids[i] = F32 row i of a, quantized as
// ggml quantizes it (quantize.glsl). One invocation per block of 32; d may be bound in windows of rows
// [row_lo, row_hi), and ids outside the window write nothing. Offsets and strides of d are in 16-bit words.
#include "common.glsl"
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer Ids { int ids[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint a_off, a_nb0, a_nb1;
    uint i_off, i_nb0;
    uint d_off, d_nb0, d_nb1, row_lo, row_hi;
} p;

uint x_base;
float load_x(uint i) { return a[x_base + i * p.a_nb0]; }

#define D_BINDING 2
#include "quantize.glsl"

void main() {
    const uint i1 = p.o1 + gl_WorkGroupID.y, blk = gl_GlobalInvocationID.x;
    const int row = ids[p.i_off + i1 * p.i_nb0];
    if (row < int(p.row_lo) || row >= int(p.row_hi) || blk >= p.ne0 / 32) {
        return;
    }
    x_base = p.a_off + i1 * p.a_nb1 + blk * 32 * p.a_nb0;
    quantize_block(2 * (p.d_off + (uint(row) - p.row_lo) * p.d_nb1 + blk * p.d_nb0));
}

#version 450
// silu(g) -> mul(., u) in one dispatch (fusion.py): s = silu(g) as unary.comp computes it, z = s * u as
// binary.comp does, both written (another node may read s). F32, rows contiguous; each invocation reads
// and writes the same elements, so an output may alias an input exactly.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer G { float g[]; };
layout(binding = 1) readonly buffer U { float u[]; };
layout(binding = 2) writeonly buffer S { float s[]; };
layout(binding = 3) writeonly buffer Z { float z[]; };

layout(push_constant) uniform Push {
    uint ne0, o1, o2, o3, box2;
    uint g_off, g_nb1, g_nb2, g_nb3;
    uint u_off, u_nb1, u_nb2, u_nb3;
    uint s_off, s_nb1, s_nb2, s_nb3;
    uint z_off, z_nb1, z_nb2, z_nb3;
} p;

uint row(uint off, uint nb1, uint nb2, uint nb3, uvec3 r) {
    return off + r.x * nb1 + r.y * nb2 + r.z * nb3;
}

void main() {
    const uvec3 r = row_of(p.o1, p.o2, p.o3, p.box2);
    const uint g_row = row(p.g_off, p.g_nb1, p.g_nb2, p.g_nb3, r);
    const uint u_row = row(p.u_off, p.u_nb1, p.u_nb2, p.u_nb3, r);
    const uint s_row = row(p.s_off, p.s_nb1, p.s_nb2, p.s_nb3, r);
    const uint z_row = row(p.z_off, p.z_nb1, p.z_nb2, p.z_nb3, r);
    for (uint i = gl_GlobalInvocationID.x; i < p.ne0; i += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        const float x = g[g_row + i];
        const float silu = x / (1.0 + exp(-x));
        s[s_row + i] = silu;
        z[z_row + i] = silu * u[u_row + i];
    }
}

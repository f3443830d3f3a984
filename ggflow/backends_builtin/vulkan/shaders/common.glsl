// Shared by every shader: the storage extensions, and how a workgroup finds its row.
//
// Tensors are bound as windows of device memory; each kernel gets, in push constants, where its tensor
// starts inside the window ("off", in units: floats, halves or 16-bit words) and its strides in the same
// units. Indices use absolute coordinates, and uint arithmetic wraps, so an offset "before" the window
// (a window that starts mid-tensor) still lands on the right element.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

// Row kernels: group y is a row (dim 1) of the box, group z walks dims 2 x 3 of it.
uvec3 row_of(uint o1, uint o2, uint o3, uint box2) {
    return uvec3(o1 + gl_WorkGroupID.y, o2 + gl_WorkGroupID.z % box2, o3 + gl_WorkGroupID.z / box2);
}

// float -> nearest float16 (ties to even) -> float: what storing in F16 (and ggml's F16 vec_dot) does to a
// value. In integer arithmetic, because drivers may drop a float(float16_t(x)) round trip: NVIDIA's does.
float round_f16(float x) {
    const uint bits = floatBitsToUint(x), sign = bits & 0x80000000u, mag = bits & 0x7FFFFFFFu;
    if (mag >= 0x7F800000u) return x;                                 // inf, NaN
    if (mag >= 0x477FF000u) return uintBitsToFloat(sign | 0x7F800000u);  // >= 65520: beyond the largest half
    if (mag >= 0x38800000u) {                                         // a normal half: keep 10 of 23 bits
        return uintBitsToFloat(sign | ((mag + 0xFFFu + ((mag >> 13) & 1u)) & ~0x1FFFu));
    }
    const uint e = mag >> 23;                                         // a subnormal half: multiples of 2^-24
    if (e < 102u) return uintBitsToFloat(sign);                       // at most 2^-25 (the tie goes to 0)
    const uint m = (mag & 0x7FFFFFu) | 0x800000u, shift = 126u - e;   // |x| = m * 2^(e - 150)
    const uint half_unit = 1u << (shift - 1u), rest = m & ((half_unit << 1) - 1u);
    uint q = m >> shift;                                              // whole units of 2^-24
    if (rest > half_unit || (rest == half_unit && (q & 1u) == 1u)) q += 1u;
    return uintBitsToFloat(sign | floatBitsToUint(float(q) * 5.9604644775390625e-8));
}

// A value stored into D: where D is F16 (D_F16), rounded to nearest even by round_f16 first, so the store
// converts an exact half whatever rounding the driver's conversion uses (Vulkan leaves it to the driver).
#if defined(D_F16)
#define TO_D(v) float16_t(round_f16(v))
#else
#define TO_D(v) D_TYPE(v)
#endif

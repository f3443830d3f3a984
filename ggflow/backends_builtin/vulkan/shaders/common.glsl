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

// float -> nearest float16 -> float: what storing in F16 (and ggml's F16 vec_dot) does to a value.
float round_f16(float x) {
    return float(float16_t(x));
}

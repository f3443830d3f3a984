// Workgroup-wide sum and max: within a subgroup by subgroup operations, then across subgroups through
// shared memory in a fixed order (deterministic, and correct for any subgroup size the device picks).
// Every invocation of the workgroup must call these, in uniform control flow.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

shared float reduce_buf[64];

float workgroup_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) reduce_buf[gl_SubgroupID] = v;
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; ++i) total += reduce_buf[i];
    barrier();
    return total;
}

float workgroup_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) reduce_buf[gl_SubgroupID] = v;
    barrier();
    float m = reduce_buf[0];
    for (uint i = 1; i < gl_NumSubgroups; ++i) m = max(m, reduce_buf[i]);
    barrier();
    return m;
}

// Workgroup-wide sum and max through shared memory (portable: no assumption on the subgroup size).
// Every invocation of the workgroup must call these, in uniform control flow.
const uint REDUCE_THREADS = 128;
shared float reduce_buf[REDUCE_THREADS];

float workgroup_sum(float v) {
    const uint t = gl_LocalInvocationID.x;
    reduce_buf[t] = v;
    barrier();
    for (uint s = REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) reduce_buf[t] += reduce_buf[t + s];
        barrier();
    }
    const float total = reduce_buf[0];
    barrier();
    return total;
}

float workgroup_max(float v) {
    const uint t = gl_LocalInvocationID.x;
    reduce_buf[t] = v;
    barrier();
    for (uint s = REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) reduce_buf[t] = max(reduce_buf[t], reduce_buf[t + s]);
        barrier();
    }
    const float m = reduce_buf[0];
    barrier();
    return m;
}

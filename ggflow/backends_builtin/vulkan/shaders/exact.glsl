// Float arithmetic rounded as C rounds it, where drivers may take shortcuts.

// a / b correctly rounded, as C's float division is. A driver may compute a / b as a * (1 / b), an ulp
// off, and may not fuse an fma, so: take the driver's quotient and its two neighbours and keep the one
// whose remainder a - q * b is smallest, the product q * b being computed exactly with Dekker's
// splitting ("precise" forbids the compiler to reassociate or contract any of it).
float signed_remainder(float a, float b, float q) {
    precise float p = q * b;
    precise float cq = 4097.0 * q;
    precise float qh = cq - (cq - q);
    precise float ql = q - qh;
    precise float cb = 4097.0 * b;
    precise float bh = cb - (cb - b);
    precise float bl = b - bh;
    precise float e = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;   // q * b = p + e exactly
    precise float r = (a - p) - e;
    return r;
}

float remainder_of(float a, float b, float q) {
    return abs(signed_remainder(a, b, q));
}

float div_rn(float a, float b) {
    precise float q0 = a / b;
    // Vulkan allows a quotient 2.5 ulp off: one correction step by the remainder
    // brings it within an ulp of the true one, and the neighbours below decide.
    precise float q = q0 + signed_remainder(a, b, q0) / b;
    const uint bits = floatBitsToUint(q);
    float best = q, best_r = remainder_of(a, b, q);
    for (int step = -1; step <= 1; step += 2) {
        const float c = uintBitsToFloat(bits + uint(step));
        const float r = remainder_of(a, b, c);
        if (r < best_r) {
            best = c;
            best_r = r;
        }
    }
    return best;
}

// C's roundf: halves away from zero (GLSL's round() may go either way)
float round_half_away(float v) {
    const float t = trunc(v);
    return abs(v - t) >= 0.5 ? t + sign(v) : t;
}

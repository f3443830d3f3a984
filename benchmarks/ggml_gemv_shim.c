/* One-token products (GEMV) on ggml's CPU backend, for benchmarks/bench_gemv_vs_ggml.py.

   Compiled by that script against a llama.cpp build the user names (GGML_DIR): only ggml's public API is
   used. The weights go where llama.cpp would put them: its CPU "extra" buffer (CPU_REPACK, where ggml
   re-lays Q4_0 / Q4_K / ... rows out for its interleaved GEMVs) when that buffer supports the product,
   else the plain CPU buffer. ggml computes with its own thread pool, as llama.cpp does. */
#include <stdio.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#define MAX_COPIES 256

static ggml_backend_t backend;
static ggml_threadpool_t pool;
static struct ggml_context *weights_ctx, *graph_ctx;
static ggml_backend_buffer_t weights_buf, graph_buf;
static struct ggml_cgraph *graphs[MAX_COPIES];
static struct ggml_tensor *outs[MAX_COPIES], *x;
static char where[64];

/* Whether the product of a weight in buft can run on the device (llama.cpp asks the same way: the op's
   weight placed in a zero-size buffer of that type). */
static int supports(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, enum ggml_type type, int rows, int k) {
    struct ggml_init_params ip = { 3 * ggml_tensor_overhead(), NULL, true };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, type, k, rows);
    struct ggml_tensor *op = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 1));
    ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = probe;
    int ok = probe != NULL && ggml_backend_dev_supports_op(dev, op);
    if (probe) ggml_backend_buffer_free(probe);
    ggml_free(ctx);
    return ok;
}

/* copies weights of rows x k of ggml type `type`, their blocks back to back in data (row_bytes a row);
   returns 0, or a negative step that failed. */
int shim_setup(int type, int rows, int k, int copies, const void *data, size_t row_bytes, int threads) {
    if (copies < 1 || copies > MAX_COPIES) return -1;
    ggml_backend_load_all();
    backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    if (!backend) return -2;
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    ggml_backend_dev_get_extra_bufts_t extra_fn = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    if (extra_fn) {
        for (ggml_backend_buffer_type_t *extra = extra_fn(dev); extra && *extra; extra++) {
            if (supports(dev, *extra, (enum ggml_type) type, rows, k)) { buft = *extra; break; }
        }
    }
    snprintf(where, sizeof where, "%s", ggml_backend_buft_name(buft));

    struct ggml_init_params wp = { (size_t) copies * ggml_tensor_overhead(), NULL, true };
    weights_ctx = ggml_init(wp);
    struct ggml_tensor *w[MAX_COPIES];
    for (int c = 0; c < copies; c++) w[c] = ggml_new_tensor_2d(weights_ctx, (enum ggml_type) type, k, rows);
    weights_buf = ggml_backend_alloc_ctx_tensors_from_buft(weights_ctx, buft);
    if (!weights_buf) return -3;
    for (int c = 0; c < copies; c++) {      /* a repacking buffer re-lays the rows out here */
        size_t bytes = (size_t) rows * row_bytes;
        ggml_backend_tensor_set(w[c], (const char *) data + (size_t) c * bytes, 0, bytes);
    }

    struct ggml_init_params gp = { (size_t) (2 * copies + 1) * ggml_tensor_overhead()
                                   + (size_t) copies * ggml_graph_overhead(), NULL, true };
    graph_ctx = ggml_init(gp);
    x = ggml_new_tensor_2d(graph_ctx, GGML_TYPE_F32, k, 1);
    for (int c = 0; c < copies; c++) {
        outs[c] = ggml_mul_mat(graph_ctx, w[c], x);
        graphs[c] = ggml_new_graph(graph_ctx);
        ggml_build_forward_expand(graphs[c], outs[c]);
    }
    graph_buf = ggml_backend_alloc_ctx_tensors(graph_ctx, backend);
    if (!graph_buf) return -4;
    struct ggml_threadpool_params tp = ggml_threadpool_params_default(threads);
    pool = ggml_threadpool_new(&tp);
    if (!pool) return -5;
    ggml_backend_cpu_set_threadpool(backend, pool);
    ggml_backend_cpu_set_n_threads(backend, threads);
    return 0;
}

const char *shim_weight_buffer(void) { return where; }

void shim_set_x(const float *values, int k) { ggml_backend_tensor_set(x, values, 0, sizeof(float) * (size_t) k); }

int shim_run(int copy) { return ggml_backend_graph_compute(backend, graphs[copy]) == GGML_STATUS_SUCCESS ? 0 : -1; }

void shim_get_out(int copy, float *out, int rows) {
    ggml_backend_tensor_get(outs[copy], out, 0, sizeof(float) * (size_t) rows);
}

/* ggml's workers poll for new work a while after a graph; paused, they sleep while ggflow's turn runs */
void shim_pause(void) { ggml_threadpool_pause(pool); }

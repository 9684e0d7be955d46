/* Compiles an ONNX model with Kiln's C API, or loads a package written by
 * `kiln compile` (a path ending in .kiln), runs it once on deterministic
 * inputs (symbolic dims bound to 1) with the outputs written into buffers
 * this program owns, and prints each output's shape, first values and sum.
 *
 *   cc run_model.c -I PREFIX/include -L PREFIX/lib -lkiln -Wl,-rpath,PREFIX/lib -lm -o run_model
 *   ./run_model model.onnx [THREADS]
 * A machine without the compiler links libkiln_runtime instead and runs packages:
 *   cc run_model.c -I PREFIX/include -L PREFIX/lib -lkiln_runtime -Wl,-rpath,PREFIX/lib -lm -o run_model
 *   ./run_model model.kiln [THREADS]
 */
#include <kiln/kiln_c.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case KILN_FLOAT32: case KILN_INT32: case KILN_UINT32: return 4;
    case KILN_FLOAT64: case KILN_INT64: case KILN_UINT64: return 8;
    case KILN_FLOAT16: case KILN_BFLOAT16: case KILN_INT16: case KILN_UINT16: return 2;
    case KILN_INT8: case KILN_UINT8: case KILN_BOOL: return 1;
    default: return 0;
  }
}

static int fail(kiln_status* s) {
  fprintf(stderr, "run_model: %s\n", kiln_status_message(s));
  kiln_status_free(s);
  return 2;
}

/* A buffer for a value of `info`'s dtype with symbolic dims bound to 1. */
static void* alloc_value(const kiln_value_info* info, int64_t* shape, size_t* bytes) {
  size_t count = 1;
  for (size_t d = 0; d < info->rank; ++d) {
    shape[d] = info->dims[d] < 0 ? 1 : info->dims[d];
    count *= (size_t)shape[d];
  }
  *bytes = count * dtype_size(info->dtype);
  /* 64-byte aligned: Kiln's kernels then read and write it in place. */
  return aligned_alloc(64, (*bytes + 63) / 64 * 64 + 64);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: run_model MODEL.onnx|MODEL.kiln [THREADS]\n");
    return 2;
  }
  printf("kiln %s (C API %d)\n", kiln_version(), kiln_c_api_version());
  kiln_options* options = kiln_options_create();
  kiln_status* s = kiln_options_set_threads(options, argc > 2 ? atoi(argv[2]) : 1);
  if (s) return fail(s);
  kiln_model* model = NULL;
  size_t len = strlen(argv[1]);
  if (len > 5 && strcmp(argv[1] + len - 5, ".kiln") == 0)
    s = kiln_load(argv[1], options, &model);
  else
    s = kiln_compile_file(argv[1], options, &model);
  kiln_options_free(options);
  if (s) return fail(s);

  size_t n_in = kiln_model_num_inputs(model), n_out = kiln_model_num_outputs(model);
  kiln_tensor* inputs = calloc(n_in, sizeof(kiln_tensor));
  kiln_tensor* outputs = calloc(n_out, sizeof(kiln_tensor));
  int64_t(*in_shapes)[16] = calloc(n_in, sizeof *in_shapes);
  int64_t(*out_shapes)[16] = calloc(n_out, sizeof *out_shapes);
  for (size_t i = 0; i < n_in; ++i) {
    kiln_value_info info;
    if ((s = kiln_model_input(model, i, &info))) return fail(s);
    if (info.rank > 16 || dtype_size(info.dtype) == 0) {
      fprintf(stderr, "run_model: input '%s' is not a tensor this example fills\n", info.name);
      return 2;
    }
    size_t bytes;
    void* data = alloc_value(&info, in_shapes[i], &bytes);
    for (size_t k = 0; k < bytes / dtype_size(info.dtype); ++k) {
      if (info.dtype == KILN_FLOAT32) ((float*)data)[k] = (float)sin(0.1 * (double)k);
      else if (info.dtype == KILN_INT64) ((int64_t*)data)[k] = (int64_t)(k % 7);
      else memset((char*)data + k * dtype_size(info.dtype), 0, dtype_size(info.dtype));
    }
    kiln_tensor t = {info.name, info.dtype, info.rank, in_shapes[i], data, bytes};
    inputs[i] = t;
    printf("input  %s: dtype %d, rank %zu\n", info.name, info.dtype, info.rank);
  }
  for (size_t i = 0; i < n_out; ++i) {
    kiln_value_info info;
    if ((s = kiln_model_output(model, i, &info))) return fail(s);
    int symbolic = 0;
    for (size_t d = 0; d < info.rank; ++d) symbolic |= info.dims[d] < 0;
    kiln_tensor t = {info.name, info.dtype, info.rank, NULL, NULL, 0};
    /* Static shapes: into this program's buffer; symbolic: Kiln allocates. */
    if (!symbolic && info.rank <= 16 && dtype_size(info.dtype) > 0) {
      t.data = alloc_value(&info, out_shapes[i], &t.bytes);
      t.shape = out_shapes[i];
    }
    outputs[i] = t;
  }
  kiln_result* result = NULL;
  if ((s = kiln_run(model, inputs, n_in, outputs, n_out, &result))) return fail(s);
  for (size_t i = 0; i < n_out; ++i) {
    printf("output %s: [", outputs[i].name);
    for (size_t d = 0; d < outputs[i].rank; ++d) printf("%s%lld", d ? ", " : "", (long long)outputs[i].shape[d]);
    printf("]");
    if (outputs[i].dtype == KILN_FLOAT32) {
      const float* v = outputs[i].data;
      size_t count = outputs[i].bytes / 4;
      double sum = 0;
      for (size_t k = 0; k < count; ++k) sum += v[k];
      printf(" first %g, sum %.6g", count ? v[0] : 0.0, sum);
    }
    printf("\n");
  }
  kiln_result_free(result);
  for (size_t i = 0; i < n_in; ++i) free(inputs[i].data);
  for (size_t i = 0; i < n_out; ++i)
    if (outputs[i].shape == out_shapes[i]) free(outputs[i].data);
  free(inputs);
  free(outputs);
  free(in_shapes);
  free(out_shapes);
  kiln_model_free(model);
  return 0;
}

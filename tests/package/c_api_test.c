/* Kiln's C API against the installed headers and library (run_c_api_test.py
 * builds and runs it): compile errors, signature queries, runs with outputs in
 * this program's buffers (aligned and not) and in Kiln's, and run errors.
 *
 *   c_api_test MODEL.onnx X.bin Y.bin   (the model: y = relu(x @ w), x f32[4,64], y f32[4,32];
 *                                        X.bin and Y.bin: x and the expected y, raw float32)
 */
#include <kiln/kiln_c.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL line %d: %s: ", __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++failures;                                          \
    }                                                      \
  } while (0)

static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = aligned_alloc(64, ((size_t)n + 63) / 64 * 64 + 64);
  *size = fread(data, 1, (size_t)n, f);
  fclose(f);
  return data;
}

/* The error `s` has `code` and its message contains `fragment`; frees it. */
static void expect_error(kiln_status* s, kiln_code code, const char* fragment, int line) {
  if (s == NULL) {
    fprintf(stderr, "FAIL line %d: no error (expected one containing '%s')\n", line, fragment);
    ++failures;
    return;
  }
  if (kiln_status_code(s) != code || strstr(kiln_status_message(s), fragment) == NULL) {
    fprintf(stderr, "FAIL line %d: error %d '%s', expected %d containing '%s'\n", line, kiln_status_code(s),
            kiln_status_message(s), code, fragment);
    ++failures;
  }
  kiln_status_free(s);
}

static int close_to(const float* got, const float* want, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (fabsf(got[i] - want[i]) > 1e-4f + 1e-4f * fabsf(want[i])) return 0;
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: c_api_test MODEL.onnx X.bin Y.bin\n");
    return 2;
  }
  size_t x_bytes = 0, y_bytes = 0, model_bytes = 0;
  float* x = read_file(argv[2], &x_bytes);
  float* want = read_file(argv[3], &y_bytes);
  void* model_data = read_file(argv[1], &model_bytes);
  if (!x || !want || !model_data || x_bytes != 4 * 64 * 4 || y_bytes != 4 * 32 * 4) {
    fprintf(stderr, "c_api_test: cannot read the model or data files\n");
    return 2;
  }

  CHECK(strlen(kiln_version()) > 0, "empty version");
  CHECK(kiln_c_api_version() == KILN_C_API_VERSION, "api version %d", kiln_c_api_version());

  /* Compile errors. */
  kiln_model* model = NULL;
  expect_error(kiln_compile_file("/nonexistent/model.onnx", NULL, &model), KILN_NOT_FOUND, "/nonexistent/model.onnx",
               __LINE__);
  CHECK(model == NULL, "model set on error");
  expect_error(kiln_compile_bytes("not a model", 11, NULL, &model), KILN_INVALID_MODEL, "<bytes>", __LINE__);
  /* Load errors: no such file; an ONNX file is not a package. */
  expect_error(kiln_load("/nonexistent/model.kiln", NULL, &model), KILN_NOT_FOUND, "/nonexistent/model.kiln", __LINE__);
  expect_error(kiln_load(argv[1], NULL, &model), KILN_INVALID_MODEL, "is not a Kiln package", __LINE__);
  CHECK(model == NULL, "model set on error");
  kiln_options* options = kiln_options_create();
  expect_error(kiln_options_set_threads(options, -1), KILN_INVALID_ARGUMENT, "threads", __LINE__);
  expect_error(kiln_options_set_select(options, "fastest"), KILN_INVALID_ARGUMENT, "fastest", __LINE__);
  CHECK(kiln_options_set_threads(options, 2) == NULL, "set_threads");
  CHECK(kiln_options_set_db(options, "") == NULL, "set_db");
  CHECK(kiln_options_add_prefer(options, "nosuch.impl") == NULL, "add_prefer");
  expect_error(kiln_compile_file(argv[1], options, &model), KILN_INVALID_ARGUMENT, "nosuch.impl", __LINE__);
  kiln_options_free(options);

  /* Compile from bytes, the signature. */
  options = kiln_options_create();
  kiln_options_set_threads(options, 2);
  kiln_options_set_db(options, "");
  kiln_status* s = kiln_compile_bytes(model_data, model_bytes, options, &model);
  kiln_options_free(options);
  if (s) {
    fprintf(stderr, "c_api_test: compile failed: %s\n", kiln_status_message(s));
    return 1;
  }
  CHECK(kiln_model_num_inputs(model) == 1 && kiln_model_num_outputs(model) == 1, "counts");
  kiln_value_info info;
  CHECK(kiln_model_input(model, 0, &info) == NULL, "input 0");
  CHECK(strcmp(info.name, "x") == 0 && info.dtype == KILN_FLOAT32 && info.rank == 2 && info.dims[0] == 4 &&
            info.dims[1] == 64 && strcmp(info.dim_names[1], "64") == 0,
        "input info %s %d %zu", info.name, info.dtype, info.rank);
  CHECK(kiln_model_output(model, 0, &info) == NULL, "output 0");
  CHECK(strcmp(info.name, "y") == 0 && info.rank == 2 && info.dims[1] == 32, "output info %s", info.name);
  expect_error(kiln_model_output(model, 1, &info), KILN_INVALID_ARGUMENT, "out of range", __LINE__);

  int64_t x_shape[2] = {4, 64}, y_shape[2] = {4, 32};
  kiln_tensor in = {"x", KILN_FLOAT32, 2, x_shape, x, x_bytes};

  /* Into this program's buffers: aligned (in place) and 4 bytes off (copied in). */
  float* storage = aligned_alloc(64, 4 * 32 * 4 + 64);
  for (int offset = 0; offset <= 1; ++offset) {
    float* y = storage + offset;
    for (int i = 0; i < 4 * 32; ++i) y[i] = NAN;
    kiln_tensor out = {"y", KILN_FLOAT32, 2, y_shape, y, 4 * 32 * 4};
    s = kiln_run(model, &in, 1, &out, 1, NULL);
    CHECK(s == NULL, "run into a buffer: %s", kiln_status_message(s));
    kiln_status_free(s);
    CHECK(out.data == y && close_to(y, want, 4 * 32), "outputs in the buffer (offset %d)", offset);
  }

  /* Into Kiln's memory, alive until kiln_result_free. */
  kiln_tensor out = {"y", 0, 0, NULL, NULL, 0};
  kiln_result* result = NULL;
  s = kiln_run(model, &in, 1, &out, 1, &result);
  CHECK(s == NULL && result != NULL, "run into Kiln's memory: %s", kiln_status_message(s));
  kiln_status_free(s);
  CHECK(out.dtype == KILN_FLOAT32 && out.rank == 2 && out.shape[0] == 4 && out.shape[1] == 32 &&
            out.bytes == 4 * 32 * 4 && close_to(out.data, want, 4 * 32),
        "Kiln-allocated output");
  kiln_result_free(result);

  /* Run errors. */
  kiln_tensor short_in = {"x", KILN_FLOAT32, 2, x_shape, x, x_bytes - 4};
  kiln_tensor y_out = {"y", KILN_FLOAT32, 2, y_shape, storage, 4 * 32 * 4};
  expect_error(kiln_run(model, &short_in, 1, &y_out, 1, NULL), KILN_INVALID_ARGUMENT, "bytes", __LINE__);
  expect_error(kiln_run(model, NULL, 0, &y_out, 1, NULL), KILN_INVALID_ARGUMENT, "missing input 'x'", __LINE__);
  kiln_tensor wrong_name = {"z", KILN_FLOAT32, 2, y_shape, storage, 4 * 32 * 4};
  expect_error(kiln_run(model, &in, 1, &wrong_name, 1, NULL), KILN_INVALID_ARGUMENT, "no output 'z'", __LINE__);
  int64_t bad_shape[2] = {4, 31};
  kiln_tensor bad_out = {"y", KILN_FLOAT32, 2, bad_shape, storage, 4 * 31 * 4};
  expect_error(kiln_run(model, &in, 1, &bad_out, 1, NULL), KILN_INVALID_ARGUMENT, "output 'y'", __LINE__);
  kiln_tensor no_buffer = {"y", 0, 0, NULL, NULL, 0};
  expect_error(kiln_run(model, &in, 1, &no_buffer, 1, NULL), KILN_INVALID_ARGUMENT, "kiln_result", __LINE__);
  kiln_tensor int_in = {"x", KILN_INT32, 2, x_shape, x, x_bytes};
  expect_error(kiln_run(model, &int_in, 1, &y_out, 1, NULL), KILN_INVALID_ARGUMENT, "input 'x'", __LINE__);
  kiln_tensor alias_out = {"y", KILN_FLOAT32, 2, y_shape, x, 4 * 32 * 4};
  expect_error(kiln_run(model, &in, 1, &alias_out, 1, NULL), KILN_INVALID_ARGUMENT, "overlaps input 'x'", __LINE__);

  kiln_model_free(model);
  free(storage);
  free(x);
  free(want);
  free(model_data);
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("c api test passed\n");
  return 0;
}

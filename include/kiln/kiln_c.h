/* Kiln's C API: compile an ONNX model, describe its inputs and outputs, run it.
 *
 * A stable C ABI: handles are opaque, every call that can fail returns a
 * kiln_status* (NULL on success; otherwise the caller frees it with
 * kiln_status_free after reading its code and message). Strings and arrays
 * Kiln returns stay valid while the handle they came from lives.
 *
 *   kiln_options* o = kiln_options_create();
 *   kiln_options_set_threads(o, 2);
 *   kiln_model* m = NULL;
 *   kiln_status* s = kiln_compile_file("model.onnx", o, &m);
 *   if (s) { fprintf(stderr, "%s\n", kiln_status_message(s)); kiln_status_free(s); }
 *   kiln_options_free(o);
 *   ...
 *   kiln_tensor in = {"input", KILN_FLOAT32, 4, shape, data, bytes};
 *   kiln_tensor out = {"output", KILN_FLOAT32, 2, out_shape, out_data, out_bytes};
 *   s = kiln_run(m, &in, 1, &out, 1, NULL);     (outputs written into out_data)
 *   kiln_model_free(m);
 *
 * Thread safety: any number of models may run at once from any number of
 * threads; calls to one model are serialized.
 */
#ifndef KILN_KILN_C_H_
#define KILN_KILN_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_C_API_VERSION 1

/* Status codes (one per kiln::StatusCode). */
typedef enum kiln_code {
  KILN_OK = 0,
  KILN_INVALID_MODEL = 1,       /* a malformed, truncated or inconsistent model */
  KILN_UNSUPPORTED = 2,         /* an op, dtype or attribute Kiln does not run */
  KILN_INVALID_ARGUMENT = 3,    /* a wrong input, output buffer or option */
  KILN_NOT_FOUND = 4,           /* a file or name that does not exist */
  KILN_IO_ERROR = 5,            /* reading or writing a file failed */
  KILN_INTERNAL = 6,            /* a bug in Kiln (code generation, JIT) */
  KILN_RESOURCE_EXHAUSTED = 7   /* more memory than the limit or the machine has */
} kiln_code;

/* Element types: ONNX's TensorProto.DataType numbers. */
typedef enum kiln_dtype {
  KILN_UNDEFINED = 0,
  KILN_FLOAT32 = 1,
  KILN_UINT8 = 2,
  KILN_INT8 = 3,
  KILN_UINT16 = 4,
  KILN_INT16 = 5,
  KILN_INT32 = 6,
  KILN_INT64 = 7,
  KILN_BOOL = 9,
  KILN_FLOAT16 = 10,
  KILN_FLOAT64 = 11,
  KILN_UINT32 = 12,
  KILN_UINT64 = 13,
  KILN_BFLOAT16 = 16
} kiln_dtype;

typedef struct kiln_status kiln_status;
typedef struct kiln_options kiln_options;
typedef struct kiln_model kiln_model;
typedef struct kiln_result kiln_result;

/* A tensor passed to or from kiln_run. `name` is the model's input or output
 * name; `shape` has `rank` dims; `data` holds `bytes` bytes, row-major. */
typedef struct kiln_tensor {
  const char* name;
  int32_t dtype; /* kiln_dtype */
  size_t rank;
  const int64_t* shape;
  void* data;
  size_t bytes;
} kiln_tensor;

/* An input or output of a compiled model. dims[i] is -1 where the dim is
 * symbolic; dim_names[i] is the dim as text ("batch", "seq + 1", "224"). */
typedef struct kiln_value_info {
  const char* name;
  int32_t dtype; /* kiln_dtype; 0 for sequences and other non-tensor values */
  size_t rank;
  const int64_t* dims;
  const char* const* dim_names;
} kiln_value_info;

/* The Kiln version ("0.1.0") and KILN_C_API_VERSION of the library. */
const char* kiln_version(void);
int kiln_c_api_version(void);

kiln_code kiln_status_code(const kiln_status* status);
/* Names the file, node, op, input or output the error is about. */
const char* kiln_status_message(const kiln_status* status);
void kiln_status_free(kiln_status* status);

/* Compile options (kiln::CompileOptions); a NULL kiln_options* means the
 * defaults. */
kiln_options* kiln_options_create(void);
void kiln_options_free(kiln_options* options);
/* Worker threads, 0 for all hardware threads. */
kiln_status* kiln_options_set_threads(kiln_options* options, int threads);
/* The tuning database kernel choice asks first: a path or a postgresql://
 * URL; "" for none. Default: $KILN_DB, else ~/.cache/kiln/tuning.db where it
 * exists. */
kiln_status* kiln_options_set_db(kiln_options* options, const char* db);
/* "priority" (default) or "measure". */
kiln_status* kiln_options_set_select(kiln_options* options, const char* select);
/* An implementation preferred where it applies ("conv.panels",
 * "matmul.packed:mr=6 nr=64"); repeatable. */
kiln_status* kiln_options_add_prefer(kiln_options* options, const char* impl);
/* Bytes one run may allocate; 0: 80% of physical memory. */
kiln_status* kiln_options_set_max_memory(kiln_options* options, int64_t bytes);

/* Compiles an ONNX model from a file or from its bytes. On success *model is
 * a handle to free with kiln_model_free. */
kiln_status* kiln_compile_file(const char* path, const kiln_options* options, kiln_model** model);
kiln_status* kiln_compile_bytes(const void* data, size_t size, const kiln_options* options, kiln_model** model);
/* Loads a package written by `kiln compile MODEL -o model.kiln` (or Python's
 * CompiledModel.save): no compiler runs; only the threads and max_memory
 * options apply. libkiln_runtime (no LLVM, protobuf or SQLite inside) has
 * every function of this header, but its kiln_compile_* return
 * KILN_UNSUPPORTED: it only loads packages. */
kiln_status* kiln_load(const char* path, const kiln_options* options, kiln_model** model);
void kiln_model_free(kiln_model* model);

size_t kiln_model_num_inputs(const kiln_model* model);
size_t kiln_model_num_outputs(const kiln_model* model);
/* Index past the count is an error. */
kiln_status* kiln_model_input(const kiln_model* model, size_t index, kiln_value_info* info);
kiln_status* kiln_model_output(const kiln_model* model, size_t index, kiln_value_info* info);

/* Runs the model. `inputs`: every input of the model, by name, read in place
 * (a buffer not 64-byte aligned is copied first). `outputs`: the outputs the
 * caller wants, by name; one whose `data` is non-NULL is written into that
 * buffer (in place where it is 64-byte aligned, else copied in; its dtype,
 * rank, shape and bytes must be the output's), one whose `data` is NULL gets
 * `dtype`, `rank`, `shape`, `data` and `bytes` set to memory Kiln allocated,
 * which lives until kiln_result_free(*result) (`result` must then be
 * non-NULL; it may be NULL when every output has a buffer). */
kiln_status* kiln_run(kiln_model* model, const kiln_tensor* inputs, size_t num_inputs, kiln_tensor* outputs,
                      size_t num_outputs, kiln_result** result);
void kiln_result_free(kiln_result* result);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_C_H_ */

# Python-driven test suites, included from tests/CMakeLists.txt. Each runs with
# PYTHONPATH=<build>/python so `import kiln` finds the freshly built module.
#   onnx    ONNX backend node tests through the Python module (filter: tests/onnx/filter.txt)
#   models  one test per zoo model: Kiln vs onnxruntime at 1 and 2 threads
#   error   malformed and adversarial models through the CLI and the Python module
#   package the Python API, the C API against an installed prefix, the graph page in headless
#           Chromium, and the wheel `pip install .` builds in a fresh virtual environment
set(KILN_TEST_ENV "PYTHONPATH=${CMAKE_BINARY_DIR}/python" "KILN_DB=off")
if(KILN_SANITIZE MATCHES "address")
  # python is not instrumented: the module's ASan runtime must be preloaded.
  # Leak checking stays on for the C++ tests; CPython's own allocations at exit
  # are not Kiln's leaks.
  list(APPEND KILN_TEST_ENV "LD_PRELOAD=${KILN_ASAN_RUNTIME}" "ASAN_OPTIONS=detect_leaks=0")
endif()
set(KILN_MODEL_CACHE_DIR ${CMAKE_BINARY_DIR}/models CACHE PATH
    "Export cache of the zoo models (tests/models/export_models.py)")

if(KILN_BUILD_PYTHON)
  add_test(NAME onnx_backend_node
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/onnx/run_backend_tests.py -j 2
            --filter ${CMAKE_CURRENT_SOURCE_DIR}/onnx/filter.txt
            --json ${CMAKE_CURRENT_BINARY_DIR}/onnx_backend_results.json)
  set_tests_properties(onnx_backend_node PROPERTIES
    LABELS onnx ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 3600)
  # The same cases through ONNX Runtime (requirements.txt pins the version): its failures must be those
  # tests/onnx/ort_failures.txt lists (the list Kiln's run checks its own
  # failures against: a case ORT passes must pass in Kiln).
  add_test(NAME onnx_backend_ort
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/onnx/run_backend_tests.py -j 2 --backend ort
            --filter ${CMAKE_CURRENT_SOURCE_DIR}/onnx/ort_failures.txt)
  # Label ort, not onnx: the sanitized build runs label onnx, and ORT is not Kiln.
  set_tests_properties(onnx_backend_ort PROPERTIES LABELS ort ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 1800)

  set(KILN_ZOO_MODELS resnet18 resnet50 mobilenet_v2 mobilenet_v3_small efficientnet_b0
      squeezenet1_1 densenet121 inception_v3 convnext_tiny vit_b_16 bert gpt2 lstm)
  foreach(model ${KILN_ZOO_MODELS})
    add_test(NAME model_${model}
      COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/models/run_model_test.py ${model}
              --cache-dir ${KILN_MODEL_CACHE_DIR})
    # Exports share the cache directory: run the model tests one at a time.
    set_tests_properties(model_${model} PROPERTIES
      LABELS models ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 3600
      RESOURCE_LOCK kiln_model_cache)
  endforeach()

  # Four models at once from five Python threads, outputs bit for bit equal to
  # serial runs; the GPT-2-style decoder's resident memory over 1000 runs on
  # random sequence lengths.
  add_test(NAME models_concurrency
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/models/run_concurrency_test.py
            --cache-dir ${KILN_MODEL_CACHE_DIR})
  add_test(NAME models_memory_flat
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/models/run_memory_test.py
            --cache-dir ${KILN_MODEL_CACHE_DIR})
  set_tests_properties(models_concurrency models_memory_flat PROPERTIES
    LABELS models ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 1800 RESOURCE_LOCK kiln_model_cache)

  # kiln opt MODEL --default-pipeline -o out.onnx: onnx.checker and ONNX Runtime
  # against the original (zoo models from the export cache, generated graphs).
  add_test(NAME models_export
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/models/run_export_test.py
            --kiln $<TARGET_FILE:kiln> --cache-dir ${KILN_MODEL_CACHE_DIR})
  set_tests_properties(models_export PROPERTIES
    LABELS models ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 1800 RESOURCE_LOCK kiln_model_cache)

  # torchvision's ssdlite and Faster R-CNN (conditioned random weights, dynamic
  # image size): every detection matched against ONNX Runtime's at three sizes.
  add_test(NAME models_detectors
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/models/run_detector_test.py
            --cache-dir ${KILN_MODEL_CACHE_DIR})
  set_tests_properties(models_detectors PROPERTIES
    LABELS models ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 1800 RESOURCE_LOCK kiln_model_cache)

  # The README's main command, minus installing and building: export, info,
  # run against ONNX Runtime's outputs, bench (scripts/demo_steps.sh).
  add_test(NAME demo
    COMMAND ${CMAKE_SOURCE_DIR}/scripts/demo_steps.sh ${CMAKE_BINARY_DIR} ${CMAKE_BINARY_DIR}/demo_test 2)
  set_tests_properties(demo PROPERTIES LABELS models TIMEOUT 900)

  add_test(NAME error_models
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/error/run_error_tests.py
            --kiln $<TARGET_FILE:kiln>)
  set_tests_properties(error_models PROPERTIES
    LABELS error ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 900)

  # The Python API: every kind of model kiln.compile takes, DLPack inputs,
  # outputs written into the caller's buffers, profile, and their errors.
  add_test(NAME package_python_api
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/package/run_api_test.py --kiln $<TARGET_FILE:kiln>)
  set_tests_properties(package_python_api PROPERTIES LABELS package ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)

  # Training: whole models' gradients (kiln.compile(..., gradient_of=)) against
  # PyTorch's autograd, and the error naming ops without a gradient rule.
  add_test(NAME train_torch_gradients
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_torch_gradients_test.py)
  set_tests_properties(train_torch_gradients PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # Training steps (kiln.Trainer: forward, backward, clipping, update as one
  # graph) against torch.optim's, step by step.
  add_test(NAME train_torch_optimizers
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_torch_training_test.py)
  set_tests_properties(train_torch_optimizers PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # Losses Kiln appends (mse, l1, bce, cross-entropy) and exported ones, against torch.nn's.
  add_test(NAME train_losses
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_losses_test.py)
  set_tests_properties(train_losses PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # Automatic checkpointing under a memory budget: bit-for-bit steps, dp against sqrt(n), errors.
  add_test(NAME train_checkpointing
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_checkpointing_test.py --kiln $<TARGET_FILE:kiln>)
  set_tests_properties(train_checkpointing PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # kiln.torch.compile in a PyTorch training loop against the plain module.
  add_test(NAME train_kiln_torch
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_kiln_torch_test.py)
  set_tests_properties(train_kiln_torch PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # ONNX's training form (training_info): a hand-written algorithm against PyTorch's SGD,
  # Kiln's steps exported and continued, malformed forms as errors.
  add_test(NAME train_onnx_training_form
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_onnx_training_form_test.py --kiln $<TARGET_FILE:kiln>)
  set_tests_properties(train_onnx_training_form PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # kiln train: per-step losses, checkpoints and resume bit for bit, export.
  add_test(NAME train_cli
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_kiln_train_test.py --kiln $<TARGET_FILE:kiln>)
  set_tests_properties(train_cli PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # kiln train under mpirun -np 2 against one process on the whole batches.
  add_test(NAME train_cli_mpi
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_kiln_train_mpi_test.py --kiln $<TARGET_FILE:kiln>)
  set_tests_properties(train_cli_mpi PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)
  # A kiln.torch module under DistributedDataParallel (gloo, two local ranks).
  add_test(NAME train_kiln_torch_ddp
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/run_kiln_torch_ddp_test.py)
  set_tests_properties(train_kiln_torch_ddp PROPERTIES LABELS train ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 600)

  # The C API: cmake --install into a fresh prefix, a C test program and
  # examples/c/run_model.c built against the installed headers and libkiln.so.
  if(TARGET kiln_c)
    add_test(NAME package_c_api
      COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/package/run_c_api_test.py --build-dir ${CMAKE_BINARY_DIR})
    set_tests_properties(package_c_api PROPERTIES LABELS package TIMEOUT 600)
  endif()

  # kiln info --graph -o graph.html rendered in headless Chromium (Debian's
  # chromium): no console message, a box per node, every node named.
  add_test(NAME package_graph_html
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/package/run_graph_html_test.py --kiln $<TARGET_FILE:kiln>)
  set_tests_properties(package_graph_html PROPERTIES LABELS package ENVIRONMENT "KILN_DB=off" TIMEOUT 600)

  # docs/tutorial/README.md run as written, block by block (its step 5 runs
  # the tutorial's template program, built by tests/CMakeLists.txt).
  add_test(NAME package_tutorial
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/package/run_tutorial_test.py --build-dir ${CMAKE_BINARY_DIR})
  set_tests_properties(package_tutorial PROPERTIES LABELS package TIMEOUT 900)

  # pip install: the wheel built from this tree, installed into a fresh
  # virtual environment, `import kiln` and the `kiln` command used from there.
  add_test(NAME package_wheel
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/package/run_wheel_test.py
            --wheelhouse ${CMAKE_SOURCE_DIR}/.venv/wheelhouse)
  set_tests_properties(package_wheel PROPERTIES LABELS package TIMEOUT 2400)

  # The tuning database on a PostgreSQL server the test starts itself
  # (Debian's postgresql, installed by scripts/install_deps.sh), with two
  # workers sharing its job queue.
  add_test(NAME db_postgres
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/db/postgres_test.py $<TARGET_FILE:kiln>)
  set_tests_properties(db_postgres PROPERTIES LABELS db ENVIRONMENT "${KILN_TEST_ENV}" TIMEOUT 900)
endif()

# ir: textual before/after tests of compiler steps (tests/ir/*.kir, RUN lines
# checked with LLVM's FileCheck) plus numeric equivalence (kiln opt --check-equiv).
find_program(KILN_FILECHECK FileCheck PATHS ${LLVM_TOOLS_BINARY_DIR} /usr/lib/llvm-19/bin NO_DEFAULT_PATH)
if(NOT KILN_FILECHECK)
  message(FATAL_ERROR "FileCheck not found: the ir tests need LLVM's FileCheck "
                      "(package llvm-19-tools, installed by scripts/install_deps.sh)")
endif()
file(GLOB KILN_IR_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ir/*.kir)
foreach(kir ${KILN_IR_TESTS})
  get_filename_component(name ${kir} NAME_WE)
  add_test(NAME ir_${name}
    COMMAND ${KILN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ir/run_ir_test.py ${kir}
            --kiln $<TARGET_FILE:kiln> --filecheck ${KILN_FILECHECK})
  set_tests_properties(ir_${name} PROPERTIES LABELS ir TIMEOUT 300 ENVIRONMENT "KILN_TARGET=avx512;KILN_DB=off")
endforeach()

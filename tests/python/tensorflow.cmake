# gradcomp.tensorflow and gradcomprun tests (issue 37), label python. The TensorFlow ones run with the interpreter of
# .venv-tf (scripts/tf-deps.sh) through tf_launch.py, which reports "skipped" (77) when TensorFlow is not installed.
function(gradcomp_add_tf_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;PROCESSORS" "ARGS;ENV" ${ARGN})
  add_test(NAME python_tf_${name} COMMAND ${Python_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tf_launch.py ${ARG_ARGS}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(python_tf_${name} PROPERTIES LABELS "python;mpi" ENVIRONMENT "${_py_env};${ARG_ENV}"
                       TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${ARG_PROCESSORS} SKIP_RETURN_CODE 77)
endfunction()

gradcomp_add_tf_test(collectives_runtime_np2 ARGS --np 2 tf_collectives_check.py TIMEOUT 360 PROCESSORS 2)
gradcomp_add_tf_test(collectives_mpi_np4 ARGS --np 4 tf_collectives_check.py TIMEOUT 480 PROCESSORS 4
                     ENV GRADCOMP_BACKEND=mpi)
gradcomp_add_tf_test(mnist_topk_np2 ARGS --np 2 tf_mnist.py --compression topk TIMEOUT 480 PROCESSORS 2)
gradcomp_add_tf_test(keras_mnist_fp16_np2 ARGS --np 2 tf_keras_mnist.py --compression fp16 TIMEOUT 480 PROCESSORS 2)
gradcomp_add_tf_test(keras_mnist_gradcomprun_np2 ARGS --gradcomprun "-np 2 -H localhost:2" tf_keras_mnist.py
                     --epochs 3 TIMEOUT 480 PROCESSORS 2)
gradcomp_add_tf_test(keras_mnist_gloo_np2 ARGS --gradcomprun "--gloo -np 2" tf_keras_mnist.py --epochs 3
                     --backward-passes-per-step 2 TIMEOUT 480 PROCESSORS 2)
gradcomp_add_pytest(test_gradcomprun.py TIMEOUT 360)

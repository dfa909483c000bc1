# Runs PROGRAM and passes only when it exits non-zero having reported a UBSan
# runtime error: a crash of another kind, or a run that goes on, fails.
execute_process(COMMAND "${PROGRAM}" RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "undefined behaviour did not stop the program:\n${out}${err}")
endif()
if(NOT err MATCHES "runtime error: signed integer overflow")
  message(FATAL_ERROR "the program failed (${result}) without a UBSan report:\n${out}${err}")
endif()

# Runs one libFuzzer target for a fixed time (used by the fuzz.<name> CTest
# entries): a fresh output corpus first, the checked-in seeds second.
# cmake -DFUZZER=... -DCORPUS=... -DSEEDS=... -DSECONDS=... -DARTIFACTS=... -P run_fuzzer.cmake
foreach(var FUZZER CORPUS SEEDS SECONDS ARTIFACTS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${CORPUS}")
file(MAKE_DIRECTORY "${CORPUS}" "${ARTIFACTS}")
execute_process(
  COMMAND "${FUZZER}" "-max_total_time=${SECONDS}" -timeout=10 -print_final_stats=1 "-artifact_prefix=${ARTIFACTS}"
          "${CORPUS}" "${SEEDS}"
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (exit ${result}); reproducers under ${ARTIFACTS}")
endif()

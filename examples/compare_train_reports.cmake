# Runs train_gpt twice with the same seed, serially and under a parallel configuration, and checks
# that every step's loss in the two --report files agrees within 1e-4 relative (the runs see the
# same global batches; only the order of fp32 sums differs). Run by CTest:
#
#   cmake -DTRAIN_GPT=<train_gpt> -DWORK_DIR=<dir of the two reports> "-DCOMMON=<shared flags>"
#         "-DPARALLEL=<parallel flags>" [-DLAUNCHER=<mpirun ...>] -P compare_train_reports.cmake
#
# COMMON, PARALLEL and LAUNCHER are command lines split as a shell would.
cmake_minimum_required(VERSION 3.19)  # string(JSON)

separate_arguments(common UNIX_COMMAND "${COMMON}")
separate_arguments(parallel UNIX_COMMAND "${PARALLEL}")
separate_arguments(launcher UNIX_COMMAND "${LAUNCHER}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(serial_report "${WORK_DIR}/serial.json")
set(parallel_report "${WORK_DIR}/parallel.json")

function(run_train_gpt report)
  execute_process(COMMAND ${ARGN} --report "${report}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "compare_train_reports: '${ARGN}' failed (${rc}):\n${out}\n${err}")
  endif()
endfunction()
run_train_gpt("${serial_report}" "${TRAIN_GPT}" ${common})
run_train_gpt("${parallel_report}" ${launcher} "${TRAIN_GPT}" ${common} ${parallel})

# A loss as an integer in units of 1e-12 (math(EXPR) has 64-bit integers only). The reports write
# losses with {:.17g}: plain decimals for any loss above 1e-4.
function(to_fixed value out)
  if(NOT value MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "compare_train_reports: cannot compare the loss '${value}'")
  endif()
  set(fraction "${CMAKE_MATCH_3}000000000000")
  string(SUBSTRING "${fraction}" 0 12 fraction)
  math(EXPR fixed "${CMAKE_MATCH_1}${fraction} + 0")
  set(${out} "${fixed}" PARENT_SCOPE)
endfunction()

file(READ "${serial_report}" serial_json)
file(READ "${parallel_report}" parallel_json)
string(JSON steps LENGTH "${serial_json}" loss)
string(JSON parallel_steps LENGTH "${parallel_json}" loss)
if(NOT steps EQUAL parallel_steps OR steps EQUAL 0)
  message(FATAL_ERROR "compare_train_reports: ${steps} serial losses, ${parallel_steps} parallel")
endif()
math(EXPR last "${steps} - 1")
foreach(step RANGE ${last})
  string(JSON a GET "${serial_json}" loss ${step})
  string(JSON b GET "${parallel_json}" loss ${step})
  to_fixed("${a}" fa)
  to_fixed("${b}" fb)
  math(EXPR difference "${fa} - ${fb}")
  if(difference LESS 0)
    math(EXPR difference "-(${difference})")
  endif()
  math(EXPR scaled "${difference} * 10000")
  if(scaled GREATER fa)
    message(FATAL_ERROR "compare_train_reports: step ${step}: serial loss ${a}, parallel ${b}, "
                        "more than 1e-4 relative apart")
  endif()
endforeach()
foreach(key IN ITEMS world ranks dp zero tp sp sp_style)
  string(JSON ${key} GET "${parallel_json}" parallel ${key})
endforeach()
message(STATUS "the ${steps} losses of ${world} ranks (${ranks}; dp ${dp} zero ${zero}, tp ${tp}, sp ${sp}, ${sp_style}) "
               "match the serial run within 1e-4")

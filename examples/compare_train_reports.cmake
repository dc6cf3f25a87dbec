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

include("${CMAKE_CURRENT_LIST_DIR}/train_report_functions.cmake")
run_train_gpt_command("" "${TRAIN_GPT}" ${common} --report "${serial_report}")
run_train_gpt_command("" ${launcher} "${TRAIN_GPT}" ${common} ${parallel} --report
                      "${parallel_report}")

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
  losses_close("${a}" "${b}" close)
  if(NOT close)
    message(FATAL_ERROR "compare_train_reports: step ${step}: serial loss ${a}, parallel ${b}, "
                        "more than 1e-4 relative apart")
  endif()
endforeach()
foreach(key IN ITEMS world ranks dp zero tp sp sp_style)
  string(JSON ${key} GET "${parallel_json}" parallel ${key})
endforeach()
message(STATUS "the ${steps} losses of ${world} ranks (${ranks}; dp ${dp} zero ${zero}, tp ${tp}, sp ${sp}, ${sp_style}) "
               "match the serial run within 1e-4")

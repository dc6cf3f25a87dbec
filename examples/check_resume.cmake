# Resume is exact (issue 15): train_gpt runs STEPS steps straight; then, in new processes, the same
# run stopped at STOP (--stop-at, saving into a checkpoint directory) and resumed from it — under
# the same plan flags (FIRST) or others (SECOND). The resumed run's losses are the straight run's
# last STEPS - STOP, bit for bit when the plans are the same (EXACT), else within 1e-4 relative.
# The resumed run also exports the final model (--export) as one plain safetensors file.
#
#   cmake -DTRAIN_GPT=<train_gpt> -DWORK_DIR=<dir> "-DCOMMON=<flags of all runs>" -DSTOP=<step>
#         "-DFIRST=<plan flags>" "-DSECOND=<plan flags of the resumed run>" -DEXACT=ON|OFF
#         [-DLAUNCHER=<mpirun ...>] -P check_resume.cmake
cmake_minimum_required(VERSION 3.19)  # string(JSON)
include("${CMAKE_CURRENT_LIST_DIR}/train_report_functions.cmake")

separate_arguments(common UNIX_COMMAND "${COMMON}")
separate_arguments(first UNIX_COMMAND "${FIRST}")
separate_arguments(second UNIX_COMMAND "${SECOND}")
separate_arguments(launcher UNIX_COMMAND "${LAUNCHER}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(checkpoints "${WORK_DIR}/checkpoints")
set(exported "${WORK_DIR}/model.safetensors")

run_train_gpt_command("" ${launcher} "${TRAIN_GPT}" ${common} ${first}
                      --report "${WORK_DIR}/straight.json")
run_train_gpt_command(stopped ${launcher} "${TRAIN_GPT}" ${common} ${first} --stop-at ${STOP}
                      --save "${checkpoints}" --report "${WORK_DIR}/stopped.json")
if(NOT stopped MATCHES "stopped after step [0-9]+ of [0-9]+ \\(--stop-at ${STOP}\\)")
  message(FATAL_ERROR "check_resume: the stopped run did not say it stopped:\n${stopped}")
endif()
run_train_gpt_command(resumed ${launcher} "${TRAIN_GPT}" ${common} ${second} --resume
                      "${checkpoints}" --save "${checkpoints}" --export "${exported}"
                      --report "${WORK_DIR}/resumed.json")
if(NOT resumed MATCHES "resumed at step ${STOP} from ")
  message(FATAL_ERROR "check_resume: the second run did not resume at step ${STOP}:\n${resumed}")
endif()
if(NOT resumed MATCHES "exported [0-9]+ tensors of step [0-9]+ to " OR NOT EXISTS "${exported}")
  message(FATAL_ERROR "check_resume: no export:\n${resumed}")
endif()

file(READ "${WORK_DIR}/straight.json" straight_json)
file(READ "${WORK_DIR}/stopped.json" stopped_json)
file(READ "${WORK_DIR}/resumed.json" resumed_json)
string(JSON steps LENGTH "${straight_json}" loss)
string(JSON stopped_steps LENGTH "${stopped_json}" loss)
string(JSON resumed_steps LENGTH "${resumed_json}" loss)
math(EXPR expected_resumed "${steps} - ${STOP}")
if(NOT stopped_steps EQUAL STOP OR NOT resumed_steps EQUAL expected_resumed)
  message(FATAL_ERROR "check_resume: ${steps} straight steps, ${stopped_steps} before the stop "
                      "(expected ${STOP}), ${resumed_steps} resumed (expected ${expected_resumed})")
endif()
math(EXPR last "${resumed_steps} - 1")
foreach(i RANGE ${last})
  math(EXPR step "${STOP} + ${i}")
  string(JSON a GET "${straight_json}" loss ${step})
  string(JSON b GET "${resumed_json}" loss ${i})
  if(EXACT)
    set(same FALSE)
    if(a STREQUAL b)
      set(same TRUE)
    endif()
  else()
    losses_close("${a}" "${b}" same)
  endif()
  if(NOT same)
    message(FATAL_ERROR "check_resume: step ${step}: straight loss ${a}, resumed ${b} (exact: "
                        "${EXACT})")
  endif()
endforeach()
if(EXACT)
  message(STATUS "the ${resumed_steps} resumed losses equal the straight run's bit for bit")
else()
  message(STATUS "the ${resumed_steps} losses resumed under '${SECOND}' match the straight run's "
                 "under '${FIRST}' within 1e-4")
endif()

# Bad resume input is refused with the reason, and nothing is overwritten (issue 15): a checkpoint
# directory is written by a run stopped early; each bad command below must fail with its message,
# and afterwards every file of the directory is still there with the same bytes.
#
#   cmake -DTRAIN_GPT=<train_gpt> -DWORK_DIR=<dir> "-DCOMMON=<flags of all runs>" -DSTEPS=<n>
#         -P check_resume_refusals.cmake
cmake_minimum_required(VERSION 3.19)
include("${CMAKE_CURRENT_LIST_DIR}/train_report_functions.cmake")

separate_arguments(common UNIX_COMMAND "${COMMON}")
file(REMOVE_RECURSE "${WORK_DIR}")
set(checkpoints "${WORK_DIR}/checkpoints")
set(empty "${WORK_DIR}/empty")
file(MAKE_DIRECTORY "${empty}")
math(EXPR stop "${STEPS} / 2")
run_train_gpt_command("" "${TRAIN_GPT}" ${common} --steps ${STEPS} --stop-at ${stop} --save
                      "${checkpoints}")

# Every file under `dir` with its SHA-256, one per line.
function(fingerprint dir out)
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${dir}" "${dir}/*")
  list(SORT files)
  set(lines "")
  foreach(f IN LISTS files)
    file(SHA256 "${dir}/${f}" hash)
    string(APPEND lines "${f} ${hash}\n")
  endforeach()
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()
fingerprint("${checkpoints}" before)
if(NOT before MATCHES "latest ")
  message(FATAL_ERROR "check_resume_refusals: no checkpoint was written:\n${before}")
endif()

# Runs train_gpt with `ARGN`; it must fail with a message matching `expected`.
function(expect_refusal expected)
  execute_process(COMMAND "${TRAIN_GPT}" ${common} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "${expected}")
    message(FATAL_ERROR "check_resume_refusals: '${ARGN}' exited ${rc}, expected a failure "
                        "matching '${expected}':\n${out}\n${err}")
  endif()
  message(STATUS "refused as expected: ${ARGN}")
endfunction()

expect_refusal("--resume '.*/empty': no checkpoint there" --steps ${STEPS} --resume "${empty}"
               --save "${empty}")
expect_refusal("--resume '.*/missing': no such directory" --steps ${STEPS} --resume
               "${WORK_DIR}/missing")
expect_refusal("holds another run's checkpoints \\(latest: step ${stop}\\)" --steps ${STEPS}
               --save "${checkpoints}")
expect_refusal("model.heads = 4; this run has 8" --steps ${STEPS} --heads 8 --resume
               "${checkpoints}" --save "${checkpoints}")
expect_refusal("schedule.steps = ${STEPS}; this run has" --steps 100 --resume "${checkpoints}"
               --save "${checkpoints}")
expect_refusal("heads do not divide over tp = 3" --steps ${STEPS} --world 3 --tp 3 --resume "${checkpoints}"
               --save "${checkpoints}")
expect_refusal("nothing left to train" --steps ${STEPS} --stop-at ${stop} --resume
               "${checkpoints}" --save "${checkpoints}")

fingerprint("${checkpoints}" after)
if(NOT before STREQUAL after)
  message(FATAL_ERROR "check_resume_refusals: the checkpoints changed:\nbefore\n${before}\n"
                      "after\n${after}")
endif()
file(GLOB left_in_empty "${empty}/*")
if(left_in_empty)
  message(FATAL_ERROR "check_resume_refusals: the empty directory got files: ${left_in_empty}")
endif()
message(STATUS "every bad resume was refused; the checkpoint directory is unchanged")

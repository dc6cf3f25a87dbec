# Runs train_gpt under a pipeline with --recompute none, selective and full (and serially), and
# checks what recomputation promises: the same loss at every step, bit for bit (the recomputed
# forward repeats the kept one's arithmetic), the serial losses within 1e-4 relative, and on
# every pp rank fewer peak context bytes for selective than none, and for full than selective
# (the reports' pipeline_peak_context_bytes, counted by the runtime). Run by CTest:
#
#   cmake -DTRAIN_GPT=<train_gpt> -DWORK_DIR=<dir of the reports> "-DCOMMON=<shared flags>"
#         "-DPARALLEL=<pipeline flags>" -P check_recompute_memory.cmake
cmake_minimum_required(VERSION 3.19)  # string(JSON)

separate_arguments(common UNIX_COMMAND "${COMMON}")
separate_arguments(parallel UNIX_COMMAND "${PARALLEL}")
file(MAKE_DIRECTORY "${WORK_DIR}")
include("${CMAKE_CURRENT_LIST_DIR}/train_report_functions.cmake")

run_train_gpt_command("" "${TRAIN_GPT}" ${common} --report "${WORK_DIR}/serial.json")
file(READ "${WORK_DIR}/serial.json" serial_json)
string(JSON steps LENGTH "${serial_json}" loss)
if(steps EQUAL 0)
  message(FATAL_ERROR "check_recompute_memory: the serial run reported no loss")
endif()
math(EXPR last_step "${steps} - 1")

set(previous_mode "")
foreach(mode IN ITEMS none selective full)
  run_train_gpt_command("" "${TRAIN_GPT}" ${common} ${parallel} --recompute ${mode} --report
                        "${WORK_DIR}/${mode}.json")
  file(READ "${WORK_DIR}/${mode}.json" json)
  string(JSON recorded GET "${json}" model recompute)
  if(NOT recorded STREQUAL mode)
    message(FATAL_ERROR "check_recompute_memory: --recompute ${mode} reported '${recorded}'")
  endif()
  string(JSON mode_steps LENGTH "${json}" loss)
  if(NOT mode_steps EQUAL steps)
    message(FATAL_ERROR "check_recompute_memory: ${steps} serial losses, ${mode_steps} with "
                        "--recompute ${mode}")
  endif()
  foreach(step RANGE ${last_step})
    string(JSON loss GET "${json}" loss ${step})
    string(JSON serial_loss GET "${serial_json}" loss ${step})
    losses_close("${serial_loss}" "${loss}" close)
    if(NOT close)
      message(FATAL_ERROR "check_recompute_memory: step ${step}: serial loss ${serial_loss}, "
                          "--recompute ${mode} ${loss}, more than 1e-4 relative apart")
    endif()
    if(previous_mode)
      string(JSON previous_loss GET "${previous_json}" loss ${step})
      if(NOT loss STREQUAL previous_loss)
        message(FATAL_ERROR "check_recompute_memory: step ${step}: --recompute ${previous_mode} "
                            "loss ${previous_loss}, ${mode} ${loss}: not the same bits")
      endif()
    endif()
  endforeach()
  string(JSON ranks LENGTH "${json}" pipeline_peak_context_bytes)
  if(ranks LESS 2)
    message(FATAL_ERROR "check_recompute_memory: ${ranks} pp ranks' peak bytes in the report")
  endif()
  math(EXPR last_rank "${ranks} - 1")
  set(peaks "")
  foreach(rank RANGE ${last_rank})
    string(JSON bytes GET "${json}" pipeline_peak_context_bytes ${rank})
    if(NOT bytes MATCHES "^[0-9]+$" OR bytes EQUAL 0)
      message(FATAL_ERROR "check_recompute_memory: rank ${rank} peak bytes '${bytes}'")
    endif()
    if(previous_mode)
      string(JSON previous_bytes GET "${previous_json}" pipeline_peak_context_bytes ${rank})
      if(NOT bytes LESS previous_bytes)
        message(FATAL_ERROR "check_recompute_memory: pp rank ${rank} holds ${bytes} context "
                            "bytes with --recompute ${mode}, not fewer than ${previous_bytes} with "
                            "${previous_mode}")
      endif()
    endif()
    list(APPEND peaks "${bytes}")
  endforeach()
  message(STATUS "--recompute ${mode}: the serial losses, peak context bytes per pp rank ${peaks}")
  set(previous_mode "${mode}")
  set(previous_json "${json}")
endforeach()

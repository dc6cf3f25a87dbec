# Functions shared by the scripts that run train_gpt and compare the losses of its --report files
# (compare_train_reports.cmake, check_resume.cmake). include()d, never run on its own.

# Runs a command line (train_gpt, maybe behind a launcher) and fails the test with its output when
# it fails; its standard output is left in `output_var` when given.
function(run_train_gpt_command output_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "'${ARGN}' failed (${rc}):\n${out}\n${err}")
  endif()
  if(output_var)
    set(${output_var} "${out}" PARENT_SCOPE)
  endif()
endfunction()

# A loss as an integer in units of 1e-12 (math(EXPR) has 64-bit integers only). The reports write
# losses with {:.17g}: plain decimals for any loss above 1e-4.
function(loss_to_fixed value out)
  if(NOT value MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "cannot compare the loss '${value}'")
  endif()
  set(fraction "${CMAKE_MATCH_3}000000000000")
  string(SUBSTRING "${fraction}" 0 12 fraction)
  math(EXPR fixed "${CMAKE_MATCH_1}${fraction} + 0")
  set(${out} "${fixed}" PARENT_SCOPE)
endfunction()

# Sets `out` to TRUE when the losses (as the reports write them) are at most 1e-4 relative apart.
function(losses_close a b out)
  loss_to_fixed("${a}" fa)
  loss_to_fixed("${b}" fb)
  math(EXPR difference "${fa} - ${fb}")
  if(difference LESS 0)
    math(EXPR difference "-(${difference})")
  endif()
  math(EXPR scaled "${difference} * 10000")
  if(scaled GREATER fa)
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

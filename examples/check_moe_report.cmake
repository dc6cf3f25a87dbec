# Runs train_gpt on a mixture-of-experts model and checks its --report: the model section names the
# experts, every step has its expert load (min <= balanced <= max, a dropped fraction in [0, 1]),
# and the model learned: the final loss (mean of the last tenth) is below the first step's by at
# least MIN_DROP nats. Run by CTest:
#
#   cmake -DTRAIN_GPT=<train_gpt> -DREPORT=<report.json> "-DARGS=<train_gpt flags>"
#         -DMIN_DROP=<nats> -P check_moe_report.cmake
cmake_minimum_required(VERSION 3.19)  # string(JSON)

separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${TRAIN_GPT}" ${args} --report "${REPORT}" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_moe_report: train_gpt ${ARGS} failed (${rc}):\n${out}\n${err}")
endif()

# A non-negative decimal as an integer in units of 1e-9 (math(EXPR) has 64-bit integers only).
function(to_fixed value out)
  if(value MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    set(fraction "${CMAKE_MATCH_3}000000000")
    string(SUBSTRING "${fraction}" 0 9 fraction)
    math(EXPR fixed "${CMAKE_MATCH_1}${fraction} + 0")
  elseif(value MATCHES "^[0-9.]+e-[0-9]+$")  # tiny: as good as 0 here
    set(fixed 0)
  else()
    message(FATAL_ERROR "check_moe_report: cannot read the number '${value}'")
  endif()
  set(${out} "${fixed}" PARENT_SCOPE)
endfunction()

file(READ "${REPORT}" json)
string(JSON experts GET "${json}" model experts)
if(experts EQUAL 0)
  message(FATAL_ERROR "check_moe_report: the report's model has no experts")
endif()
string(JSON steps LENGTH "${json}" loss)
string(JSON moe_steps LENGTH "${json}" moe)
if(NOT steps EQUAL moe_steps)
  message(FATAL_ERROR "check_moe_report: ${steps} losses but ${moe_steps} expert-load records")
endif()
math(EXPR last "${steps} - 1")
foreach(step RANGE ${last})
  foreach(key IN ITEMS load_min load_max balanced_load dropped_fraction)
    string(JSON ${key} GET "${json}" moe ${step} ${key})
    to_fixed("${${key}}" ${key})
  endforeach()
  string(JSON per_expert LENGTH "${json}" moe ${step} tokens_per_expert)
  if(NOT per_expert EQUAL experts OR load_min GREATER balanced_load OR
     balanced_load GREATER load_max OR dropped_fraction GREATER 1000000000)
    message(FATAL_ERROR "check_moe_report: step ${step}: ${per_expert} experts' loads, min "
                        "${load_min} balanced ${balanced_load} max ${load_max} (1e-9 units), "
                        "dropped ${dropped_fraction}")
  endif()
endforeach()
string(JSON first GET "${json}" loss 0)
string(JSON final GET "${json}" final_loss)
to_fixed("${first}" first_fixed)
to_fixed("${final}" final_fixed)
to_fixed("${MIN_DROP}" drop_fixed)
math(EXPR dropped_by "${first_fixed} - ${final_fixed}")
if(dropped_by LESS drop_fixed)
  message(FATAL_ERROR "check_moe_report: the loss went from ${first} to ${final}, less than "
                      "${MIN_DROP} nats down")
endif()
string(JSON ep GET "${json}" parallel ep)
message(STATUS "${experts} experts (ep ${ep}): the loss went from ${first} to ${final} in ${steps} "
               "steps; every step's expert load reported")

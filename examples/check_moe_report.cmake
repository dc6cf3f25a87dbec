# Runs train_gpt on a mixture-of-experts model and checks its --report: the model section names the
# experts, every step has its expert load (min <= balanced <= max, a dropped fraction in [0, 1]),
# and the model learned: the final loss (mean of the last tenth) is below the first step's by at
# least MIN_DROP nats. Run by CTest:
#
#   cmake -DTRAIN_GPT=<train_gpt> -DREPORT=<report.json> "-DARGS=<train_gpt flags>"
#         -DMIN_DROP=<nats> [-DDENSE_ARGS=<flags> -DMAX_EXCESS=<nats> -DMAX_GAP=<nats>]
#         [-DMAX_IMBALANCE=<ratio>] -P check_moe_report.cmake
#
# With DENSE_ARGS it also trains the dense model those flags name and requires the MoE model's
# final loss to be within MAX_EXCESS nats of the dense model's and within MAX_GAP of the source's
# entropy floor. With MAX_IMBALANCE, the busiest expert's load over the last tenth of the steps
# (summed) is at most that many times the balanced load.
cmake_minimum_required(VERSION 3.19)  # string(JSON)

function(run_train_gpt flags report)
  separate_arguments(args UNIX_COMMAND "${flags}")
  execute_process(COMMAND "${TRAIN_GPT}" ${args} --report "${report}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_moe_report: train_gpt ${flags} failed (${rc}):\n${out}\n${err}")
  endif()
endfunction()
run_train_gpt("${ARGS}" "${REPORT}")

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
if(DEFINED MAX_IMBALANCE)
  # The last tenth of the steps, as final_loss: the busiest expert against the balanced load.
  math(EXPR window "${steps} / 10")
  if(window LESS 1)
    set(window 1)
  endif()
  math(EXPR first_of_window "${steps} - ${window}")
  set(busiest 0)
  set(balanced 0)
  foreach(step RANGE ${first_of_window} ${last})
    string(JSON value GET "${json}" moe ${step} load_max)
    to_fixed("${value}" value)
    math(EXPR busiest "${busiest} + ${value} / 1000")  # 1e-6 units: sums stay in 64 bits
    string(JSON value GET "${json}" moe ${step} balanced_load)
    to_fixed("${value}" value)
    math(EXPR balanced "${balanced} + ${value} / 1000")
  endforeach()
  to_fixed("${MAX_IMBALANCE}" ratio)
  # balanced x ratio, in 1e-6 units: (balanced / 1000) x (the ratio in 1e-3 units)
  math(EXPR bound "${balanced} / 1000 * (${ratio} / 1000000)")
  math(EXPR busiest_tokens "${busiest} / 1000000")
  math(EXPR balanced_tokens "${balanced} / 1000000")
  if(busiest GREATER bound)
    message(FATAL_ERROR "check_moe_report: over the last ${window} steps the busiest expert kept "
                        "${busiest_tokens} tokens against a balanced ${balanced_tokens}, more "
                        "than ${MAX_IMBALANCE} times it")
  endif()
  message(STATUS "load over the last ${window} steps: the busiest expert kept ${busiest_tokens} "
                 "tokens, ${balanced_tokens} balanced")
endif()
if(DEFINED DENSE_ARGS)
  string(REGEX REPLACE "\\.json$" "_dense.json" dense_report "${REPORT}")
  run_train_gpt("${DENSE_ARGS}" "${dense_report}")
  file(READ "${dense_report}" dense_json)
  string(JSON dense_experts GET "${dense_json}" model experts)
  if(NOT dense_experts EQUAL 0)
    message(FATAL_ERROR "check_moe_report: DENSE_ARGS train a model with experts")
  endif()
  string(JSON dense_final GET "${dense_json}" final_loss)
  string(JSON floor GET "${json}" data entropy_floor)
  foreach(value IN ITEMS dense_final floor MAX_EXCESS MAX_GAP)
    to_fixed("${${value}}" ${value}_fixed)
  endforeach()
  math(EXPR excess_bound "${dense_final_fixed} + ${MAX_EXCESS_fixed}")
  math(EXPR gap_bound "${floor_fixed} + ${MAX_GAP_fixed}")
  if(final_fixed GREATER excess_bound OR final_fixed GREATER gap_bound)
    message(FATAL_ERROR "check_moe_report: the MoE model's final loss ${final} against the dense "
                        "model's ${dense_final} (at most ${MAX_EXCESS} above) and the entropy "
                        "floor ${floor} (at most ${MAX_GAP} above)")
  endif()
  message(STATUS "final loss: MoE ${final}, dense ${dense_final}, entropy floor ${floor}")
endif()
string(JSON ep GET "${json}" parallel ep)
message(STATUS "${experts} experts (ep ${ep}): the loss went from ${first} to ${final} in ${steps} "
               "steps; every step's expert load reported")

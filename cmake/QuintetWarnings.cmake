# quintet_project_options: compile options for the project's own tests, benchmarks and examples
# (never put on the library target, whose consumers choose their own warnings).
add_library(quintet_project_options INTERFACE)
target_compile_options(quintet_project_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings --expt-relaxed-constexpr
                             -Xcompiler=-Wall,-Wextra,-Werror>)
target_link_libraries(quintet_project_options INTERFACE quintet::quintet)

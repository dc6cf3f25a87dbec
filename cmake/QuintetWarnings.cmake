# quintet_project_options: compile options for the project's own tests, benchmarks and examples
# (never put on the library target, whose consumers choose their own warnings).
add_library(quintet_project_options INTERFACE)
target_compile_options(quintet_project_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings --expt-relaxed-constexpr
                             -Xcompiler=-Wall,-Wextra,-Werror>
  # CMake 3.25 does not know how to ask nvcc 13 for C++20, so the flag is given directly.
  $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
target_link_libraries(quintet_project_options INTERFACE quintet::quintet)

// Runner for GPU test binaries: "[device]" tests need a CUDA device and "[no-device]" tests need
// its absence; the one that cannot run here exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <quintet/tensor/cuda_memory.hpp>

#include <cstdio>
#include <string>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  const bool has_device = quintet::cuda_device_count() > 0;
  const auto& filters = session.configData().testsOrTags;
  const std::string filter = filters.empty() ? std::string() : filters.front();
  if (filter == "[device]" && !has_device) {
    std::puts("no CUDA device answers: device tests skipped");
    return 77;
  }
  if (filter == "[no-device]" && has_device) {
    std::puts("a CUDA device is present: no-device tests skipped");
    return 77;
  }
  return session.run();
}

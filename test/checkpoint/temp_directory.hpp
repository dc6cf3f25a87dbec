// A fresh directory under the system's temporary directory, removed with everything in it when
// the test ends.
#pragma once

#include <fmt/format.h>

#include <filesystem>
#include <system_error>

#include <unistd.h>

namespace quintet::test {

class temp_directory {
 public:
  temp_directory() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            fmt::format("quintet-checkpoint-test-{}-{}", ::getpid(), counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  temp_directory(const temp_directory&) = delete;
  temp_directory& operator=(const temp_directory&) = delete;
  ~temp_directory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace quintet::test

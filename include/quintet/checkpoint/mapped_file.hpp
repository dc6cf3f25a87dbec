// mapped_file: a whole file mapped read-only into memory (POSIX mmap). Readers take views of its
// byte ranges; only the pages a view touches are read from disk, so a rank that needs a slice of
// a large shard reads that slice. The file must not be truncated while mapped (reading a page
// past the new end raises SIGBUS); checkpoints are never modified after their commit.
#pragma once

#include <quintet/core/error.hpp>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace quintet::checkpoint {

class mapped_file {
 public:
  explicit mapped_file(std::filesystem::path path) : path_(std::move(path)) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    QUINTET_CHECK(fd >= 0, "cannot open '{}' for reading: {}", path_.string(),
                  std::strerror(errno));
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      const int code = errno;
      ::close(fd);
      QUINTET_FAIL("cannot stat '{}': {}", path_.string(), std::strerror(code));
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd);
      QUINTET_FAIL("'{}' is not a regular file", path_.string());
    }
    size_ = static_cast<std::size_t>(info.st_size);
    if (size_ > 0) {  // mmap of zero bytes fails; an empty file is an empty view
      void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (address == MAP_FAILED) {
        const int code = errno;
        ::close(fd);
        QUINTET_FAIL("cannot map '{}' ({} bytes): {}", path_.string(), size_, std::strerror(code));
      }
      data_ = static_cast<const std::byte*>(address);
    }
    ::close(fd);  // the mapping keeps the file alive
  }

  mapped_file(mapped_file&& other) noexcept
      : path_(std::move(other.path_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  mapped_file& operator=(mapped_file&& other) noexcept {
    if (this != &other) {
      unmap();
      path_ = std::move(other.path_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { unmap(); }

  const std::filesystem::path& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }

 private:
  void unmap() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace quintet::checkpoint

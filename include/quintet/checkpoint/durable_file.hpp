// Durable file operations (POSIX): writing a file and forcing it to disk, forcing a directory's
// entries to disk, and renaming. A checkpoint is durable when its bytes were fsync'ed before the
// rename that publishes them, and the directory holding the rename was fsync'ed after it
// (docs/checkpoint.md, "Commit protocol"). Every failure raises quintet::error naming the path
// and the system's reason.
#pragma once

#include <quintet/core/error.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace quintet::checkpoint {

// A file opened for writing (created or truncated), written sequentially.
class output_file {
 public:
  explicit output_file(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    QUINTET_CHECK(fd_ >= 0, "cannot create '{}': {}", path_.string(), std::strerror(errno));
  }
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;
  // Closes without reporting errors; call close() to have them reported.
  ~output_file() {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const ::ssize_t written = ::write(fd_, bytes.data(), bytes.size());
      if (written < 0 && errno == EINTR) continue;
      QUINTET_CHECK(written > 0, "cannot write {} bytes to '{}': {}", bytes.size(), path_.string(),
                    written < 0 ? std::strerror(errno) : "no progress");
      bytes = bytes.subspan(static_cast<std::size_t>(written));
    }
  }
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }

  // Forces the file's data and size to the disk (fsync).
  void sync() {
    QUINTET_CHECK(::fsync(fd_) == 0, "cannot fsync '{}': {}", path_.string(), std::strerror(errno));
  }

  void close() {
    const int fd = std::exchange(fd_, -1);
    QUINTET_CHECK(::close(fd) == 0, "cannot close '{}': {}", path_.string(), std::strerror(errno));
  }

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// Writes `content` to `path` (replacing it), fsync'ed when `sync`.
inline void write_file(const std::filesystem::path& path, std::string_view content, bool sync) {
  output_file file(path);
  file.write(content);
  if (sync) file.sync();
  file.close();
}

// Forces the entries of `directory` (files created, renamed or removed in it) to the disk. A
// filesystem that cannot sync directories (EINVAL) is accepted: it offers nothing stronger.
inline void sync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  QUINTET_CHECK(fd >= 0, "cannot open directory '{}': {}", directory.string(),
                std::strerror(errno));
  const int result = ::fsync(fd);
  const int code = errno;
  ::close(fd);
  QUINTET_CHECK(result == 0 || code == EINVAL, "cannot fsync directory '{}': {}",
                directory.string(), std::strerror(code));
}

// rename(2): atomic within one filesystem; replaces a file or an empty directory at `to`.
inline void rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  QUINTET_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename '{}' to '{}': {}",
                from.string(), to.string(), std::strerror(errno));
}

// Reads a whole (small) file: pointer files, the checkpoint index.
inline std::string read_small_file(const std::filesystem::path& path, std::size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  QUINTET_CHECK(fd >= 0, "cannot open '{}' for reading: {}", path.string(), std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ::ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int code = errno;
      ::close(fd);
      QUINTET_FAIL("cannot read '{}': {}", path.string(), std::strerror(code));
    }
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
    if (text.size() > limit) {
      ::close(fd);
      QUINTET_FAIL("'{}' is larger than the limit of {} bytes", path.string(), limit);
    }
  }
  ::close(fd);
  return text;
}

}  // namespace quintet::checkpoint

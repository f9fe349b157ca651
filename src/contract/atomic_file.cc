#include "contract/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <system_error>

namespace sgpu::contract {
namespace {

[[noreturn]] void fail(int error, const std::string& what, const std::filesystem::path& path) {
  throw std::system_error(error, std::generic_category(), what + " " + path.string());
}

void fsync_folder(const std::filesystem::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(errno, "cannot open the folder", folder);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) fail(error, "cannot fsync the folder", folder);
}

}  // namespace

std::filesystem::path sibling_for_writing(const std::filesystem::path& path) {
  static std::atomic<unsigned long> count{0};
  return path.parent_path() / ("." + path.filename().string() + "." + std::to_string(::getpid()) +
                               "-" + std::to_string(count++) + ".tmp");
}

void publish_file(const std::filesystem::path& written, const std::filesystem::path& path,
                  Durability durability) {
  if (::rename(written.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(written.c_str());
    fail(error, "cannot rename " + written.string() + " to", path);
  }
  if (durability == Durability::kSynced) {
    fsync_folder(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
  }
}

void write_file_atomically(const std::filesystem::path& path, std::string_view content,
                           const AtomicWrite& how) {
  const std::filesystem::path aside = sibling_for_writing(path);
  const int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, how.mode);
  if (fd < 0) fail(errno, "cannot create", aside);
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(aside.c_str());
      fail(error, "cannot write", aside);
    }
    done += static_cast<std::size_t>(n);
  }
  const bool synced = how.durability != Durability::kSynced || ::fsync(fd) == 0;
  const int sync_error = errno;
  if (::close(fd) != 0 || !synced) {
    const int error = synced ? errno : sync_error;
    ::unlink(aside.c_str());
    fail(error, "cannot write", aside);
  }
  if (how.before_rename) how.before_rename();
  publish_file(aside, path, how.durability);
}

}  // namespace sgpu::contract

#include "node/shm_segments.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <ctime>

#include <spdlog/spdlog.h>

namespace grove::node {

bool lock_segment(int fd) {
  return ::flock(fd, LOCK_EX | LOCK_NB) == 0;
}

bool is_segment_name(const std::string& name) {
  constexpr std::string_view prefix = "grove-";
  constexpr std::size_t id_end = prefix.size() + 16;
  if (name.size() < id_end || name.compare(0, prefix.size(), prefix) != 0) return false;
  for (std::size_t i = prefix.size(); i < id_end; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  if (name.size() == id_end) return true;
  // A collective segment: "-c" and 1 to 9 digits.
  if (name.size() < id_end + 3 || name.size() > id_end + 11 || name.compare(id_end, 2, "-c") != 0)
    return false;
  for (std::size_t i = id_end + 2; i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  return true;
}

SweepResult sweep_stale_segments(const std::filesystem::path& dir, std::chrono::seconds min_age) {
  SweepResult r;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_segment_name(name)) continue;
    const int fd = ::open(it->path().c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // another user's, or gone meanwhile
    struct stat st {};
    const bool old_enough = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                            std::time(nullptr) - st.st_ctime >= min_age.count();
    // Unlinked while we hold the lock: an owner starting now cannot have locked it yet, and one
    // that held it is gone (the kernel drops a dead process's locks).
    if (old_enough && lock_segment(fd) && ::unlink(it->path().c_str()) == 0) {
      ++r.removed;
      r.bytes += static_cast<std::uint64_t>(st.st_size);
      spdlog::info("removed {} ({} MB of shared memory): its node is gone", it->path().string(),
                   st.st_size / 1000000);
    }
    ::close(fd);
  }
  return r;
}

}  // namespace grove::node

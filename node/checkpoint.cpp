#include "node/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

#include "transport/crypto.hpp"

namespace grove::node {

namespace {
constexpr char kMagic[8] = {'G', 'R', 'V', 'C', 'K', 'P', 'T', '1'};
constexpr std::uint32_t kConf = 0x636f6e66;  // "conf"
constexpr std::uint32_t kMeta = 0x6d657461;  // "meta"
constexpr std::uint32_t kOutr = 0x6f757472;  // "outr"
constexpr std::uint32_t kWork = 0x776f726b;  // "work"
constexpr std::size_t kHash = 32;
constexpr std::size_t kPiece = 4u << 20;  // bytes read or copied at a time

void put_le(std::vector<std::uint8_t>& b, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
std::uint64_t get_le(const std::uint8_t* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Fills `out` from `fd` at `offset` (false: a read error or the end of the file).
bool pread_all(int fd, std::uint64_t offset, std::span<std::uint8_t> out) {
  for (std::size_t got = 0; got < out.size();) {
    const ssize_t n =
        ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

std::error_code last_error() {
  return {errno, std::generic_category()};
}

void fsync_dir(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}
}  // namespace

namespace {
// The file's bytes in order, each piece handed to `sink` (false: stop). The checksum is taken
// along the way, so the file is never assembled in memory.
bool emit_checkpoint(const Checkpoint& c,
                     const std::function<bool(std::span<const std::uint8_t>)>& sink) {
  transport::Blake2b256 h;
  const auto out = [&](std::span<const std::uint8_t> piece) {
    h.update(piece);
    return sink(piece);
  };
  const auto sec = [&](std::uint32_t tag, std::span<const std::uint8_t> data) {
    std::vector<std::uint8_t> head;
    put_le(head, tag, 4);
    put_le(head, data.size(), 8);
    return out(head) && out(data);
  };
  // The outer state piece by piece: from the shared blob (read a piece at a time), or from the
  // state's own vectors.
  const auto outer_section = [&] {
    std::vector<std::uint8_t> head;
    put_le(head, kOutr, 4);
    if (!c.outer_blob) {
      put_le(head, optim::serialized_size(c.outer), 8);
      return out(head) && optim::serialize_to(c.outer, out);
    }
    const std::uint64_t size = c.outer_blob->size();
    put_le(head, size, 8);
    if (!out(head)) return false;
    std::vector<std::uint8_t> piece(
        static_cast<std::size_t>(std::min<std::uint64_t>(size, kPiece)));
    for (std::uint64_t off = 0; off < size; off += piece.size()) {
      const auto p = std::span(piece).first(
          static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), size - off)));
      if (!c.outer_blob->read(off, p) || !out(p)) return false;
    }
    return true;
  };
  std::vector<std::uint8_t> meta;
  put_le(meta, c.step, 8);
  put_le(meta, c.round, 8);
  put_le(meta, c.tokens, 8);
  if (!out({reinterpret_cast<const std::uint8_t*>(kMagic), 8}) ||
      !sec(kConf,
           {reinterpret_cast<const std::uint8_t*>(c.config_text.data()), c.config_text.size()}) ||
      !sec(kMeta, meta) || !outer_section() || !sec(kWork, c.workload))
    return false;
  const auto d = h.final();
  return sink(d);
}
}  // namespace

std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c) {
  std::vector<std::uint8_t> b;
  emit_checkpoint(c, [&](std::span<const std::uint8_t> piece) {
    b.insert(b.end(), piece.begin(), piece.end());
    return true;
  });
  return b;
}

transport::Result<Checkpoint> decode_checkpoint_from(std::uint64_t size,
                                                     const optim::ByteReader& read,
                                                     std::size_t max_values,
                                                     const optim::FloatAllocator& alloc) {
  const auto bad = [](const char* w) -> transport::Result<Checkpoint> {
    return {transport::errc::malformed, w};
  };
  std::uint8_t magic[8];
  if (size < 8 + kHash || !read(0, magic) || std::memcmp(magic, kMagic, 8) != 0)
    return bad("not a grove checkpoint");
  const std::uint64_t body = size - kHash;
  {  // the hash first, over the whole body: nothing is parsed from a damaged file
    transport::Blake2b256 h;
    std::vector<std::uint8_t> piece(
        static_cast<std::size_t>(std::min<std::uint64_t>(body, kPiece)));
    for (std::uint64_t off = 0; off < body; off += piece.size()) {
      const auto p = std::span(piece).first(
          static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), body - off)));
      if (!read(off, p)) return bad("unreadable");
      h.update(p);
    }
    std::uint8_t want[kHash];
    if (!read(body, want)) return bad("unreadable");
    const auto got = h.final();
    if (std::memcmp(got.data(), want, kHash) != 0)
      return bad("checksum mismatch (damaged or incomplete file)");
  }
  Checkpoint c;
  bool conf = false, meta = false, outr = false, work = false;
  const auto bytes_of = [&](std::uint64_t at, std::uint64_t len, std::vector<std::uint8_t>& v) {
    v.resize(static_cast<std::size_t>(len));
    return read(at, v);
  };
  for (std::uint64_t at = 8; at < body;) {
    std::uint8_t head[12];
    if (body - at < 12 || !read(at, head)) return bad("truncated section header");
    const auto tag = static_cast<std::uint32_t>(get_le(head, 4));
    const auto len = get_le(head + 4, 8);
    at += 12;
    if (len > body - at) return bad("section longer than the file");
    const std::uint64_t data = at;
    at += len;
    std::vector<std::uint8_t> v;
    if (tag == kConf && !conf) {
      if (!bytes_of(data, len, v)) return bad("unreadable");
      c.config_text.assign(v.begin(), v.end());
      conf = true;
    } else if (tag == kMeta && !meta) {
      if (len != 24 || !bytes_of(data, len, v)) return bad("bad counters section");
      c.step = get_le(v.data(), 8);
      c.round = get_le(v.data() + 8, 8);
      c.tokens = get_le(v.data() + 16, 8);
      meta = true;
    } else if (tag == kOutr && !outr) {
      auto o = optim::deserialize_from(
          len,
          [&](std::uint64_t off, std::span<std::uint8_t> out) {
            return off <= len && out.size() <= len - off && read(data + off, out);
          },
          max_values, alloc);
      if (!o) return bad("bad outer state");
      c.outer = std::move(*o);
      outr = true;
    } else if (tag == kWork && !work) {
      if (!bytes_of(data, len, c.workload)) return bad("unreadable");
      work = true;
    } else {
      return bad("unknown or repeated section");
    }
  }
  if (!(conf && meta && outr && work)) return bad("a section is missing");
  return c;
}

transport::Result<Checkpoint> decode_checkpoint(std::span<const std::uint8_t> bytes,
                                                std::size_t max_values) {
  return decode_checkpoint_from(
      bytes.size(),
      [&](std::uint64_t offset, std::span<std::uint8_t> out) {
        if (offset > bytes.size() || out.size() > bytes.size() - offset) return false;
        if (!out.empty()) std::memcpy(out.data(), bytes.data() + offset, out.size());
        return true;
      },
      max_values);
}

namespace {
// Writes `path` from the pieces `fill` hands to its sink, through a temporary file: write, fsync,
// rename, fsync the directory. At no instant does `path` hold a partial file.
std::error_code write_pieces_atomically(
    const std::filesystem::path& path,
    const std::function<bool(const std::function<bool(std::span<const std::uint8_t>)>&)>& fill) {
  auto tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return last_error();
  std::error_code ec;
  const bool filled = fill([&](std::span<const std::uint8_t> data) {
    for (std::size_t off = 0; off < data.size();) {
      const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ec = n < 0 ? last_error() : std::make_error_code(std::errc::io_error);
        return false;
      }
      off += static_cast<std::size_t>(n);
    }
    return true;
  });
  if (!filled && !ec) ec = std::make_error_code(std::errc::io_error);
  if (!ec && ::fsync(fd) != 0) ec = last_error();
  ::close(fd);
  if (!ec && ::rename(tmp.c_str(), path.c_str()) != 0) ec = last_error();
  if (ec) {
    ::unlink(tmp.c_str());
    return ec;
  }
  fsync_dir(path.parent_path());
  return {};
}
}  // namespace

std::error_code write_file_atomically(const std::filesystem::path& path,
                                      std::span<const std::uint8_t> data) {
  return write_pieces_atomically(path, [&](const auto& sink) { return sink(data); });
}

std::error_code save_checkpoint(const std::filesystem::path& dir, const Checkpoint& c,
                                bool keep_previous) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ec;
  const auto cur = dir / "checkpoint.bin", prev = dir / "checkpoint.prev";
  // Write the new file first (under a temporary name), then move the old one aside and the new
  // one in: at every instant one complete checkpoint exists under one of the two names.
  auto next = dir / "checkpoint.next";
  if ((ec = write_pieces_atomically(next,
                                    [&](const auto& sink) { return emit_checkpoint(c, sink); })))
    return ec;
  if (keep_previous) {
    if (std::filesystem::exists(cur) && ::rename(cur.c_str(), prev.c_str()) != 0)
      return last_error();
  } else {
    ::unlink(prev.c_str());  // older than `cur`, which stays complete until the rename
  }
  if (::rename(next.c_str(), cur.c_str()) != 0) return last_error();
  fsync_dir(dir);
  return {};
}

LoadedCheckpoint load_latest(const std::filesystem::path& dir, std::uint64_t max_bytes,
                             const optim::FloatAllocator& alloc) {
  std::string problems;
  // checkpoint.next exists only between its (atomic) creation and the final rename: then it is
  // the newest complete one.
  for (const char* name : {"checkpoint.next", "checkpoint.bin", "checkpoint.prev"}) {
    const auto p = dir / name;
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size < 0 ||
        static_cast<std::uint64_t>(st.st_size) > max_bytes) {
      ::close(fd);
      problems += std::string(problems.empty() ? "" : "; ") + name + ": too large or unreadable";
      continue;
    }
    // Read piece by piece (pread): the file is never held in memory whole.
    auto c = decode_checkpoint_from(
        static_cast<std::uint64_t>(st.st_size),
        [fd](std::uint64_t offset, std::span<std::uint8_t> out) {
          return pread_all(fd, offset, out);
        },
        std::size_t{1} << 31, alloc);
    ::close(fd);
    if (c) return {std::move(*c), problems};
    problems += std::string(problems.empty() ? "" : "; ") + name + ": " + c.why();
  }
  return {std::nullopt, problems};
}

}  // namespace grove::node

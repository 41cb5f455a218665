#include "transport/identity.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "transport/error.hpp"

namespace grove::transport {
namespace {
constexpr char kIdPrefix[] = "grove-node-id-v1";
constexpr char kKeyMagic[] = "GROVEID1";  // file: magic(8) || Ed25519 seed(32)
constexpr std::size_t kFileSize = 8 + 32;

[[noreturn]] void fail(const std::filesystem::path& p, const std::string& why) {
  throw ConfigError("identity key '" + p.string() + "': " + why);
}

void write_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> data) {
  auto tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) fail(tmp, std::strerror(errno));
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail(tmp, std::strerror(errno));
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail(tmp, std::strerror(errno));
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, std::strerror(errno));
  // fsync the directory so the rename itself survives a crash.
  int dfd = ::open(path.parent_path().empty() ? "." : path.parent_path().c_str(),
                   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}
}  // namespace

NodeId node_id_from_key(const PublicKey& pk) {
  ensure_sodium();
  NodeId id;
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, id.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(kIdPrefix),
                            sizeof(kIdPrefix) - 1);
  crypto_generichash_update(&st, pk.data(), pk.size());
  crypto_generichash_final(&st, id.data(), id.size());
  return id;
}

std::string to_hex(const NodeId& id) {
  return to_hex(std::span<const std::uint8_t>(id));
}
std::string short_id(const NodeId& id) {
  return to_hex(id).substr(0, 8);
}

bool verify_signature(const PublicKey& pk, std::span<const std::uint8_t> msg,
                      const Signature& sig) {
  ensure_sodium();
  return crypto_sign_verify_detached(sig.data(), msg.data(), msg.size(), pk.data()) == 0;
}

Identity Identity::generate() {
  ensure_sodium();
  Identity id;
  crypto_sign_keypair(id.pk_.data(), id.sk_.data());
  id.finish();
  return id;
}

Identity Identity::from_seed(const std::array<std::uint8_t, 32>& seed) {
  ensure_sodium();
  Identity id;
  crypto_sign_seed_keypair(id.pk_.data(), id.sk_.data(), seed.data());
  id.finish();
  return id;
}

Identity Identity::load_or_create(const std::filesystem::path& state_dir) {
  ensure_sodium();
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec)
    throw ConfigError("cannot create state directory '" + state_dir.string() +
                      "': " + ec.message());
  const auto path = state_dir / "identity.key";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (st.st_mode & (S_IRWXG | S_IRWXO))
      fail(path, "permissions are too open (must be 0600); fix with chmod 600");
    std::ifstream in(path, std::ios::binary);
    std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) fail(path, "cannot be read");
    if (buf.size() != kFileSize || std::memcmp(buf.data(), kKeyMagic, 8) != 0)
      fail(path, "corrupt (wrong size or header)");
    Identity id;
    crypto_sign_seed_keypair(id.pk_.data(), id.sk_.data(),
                             reinterpret_cast<const unsigned char*>(buf.data() + 8));
    sodium_memzero(buf.data(), buf.size());
    id.finish();
    return id;
  }
  if (errno != ENOENT) fail(path, std::strerror(errno));
  Identity id = generate();
  std::array<std::uint8_t, kFileSize> file{};
  std::memcpy(file.data(), kKeyMagic, 8);
  crypto_sign_ed25519_sk_to_seed(file.data() + 8, id.sk_.data());
  write_atomically(path, file);
  sodium_memzero(file.data(), file.size());
  return id;
}

Identity::~Identity() {
  sodium_memzero(sk_.data(), sk_.size());
}

void Identity::finish() {
  id_ = node_id_from_key(pk_);
}

Signature Identity::sign(std::span<const std::uint8_t> msg) const {
  Signature sig;
  crypto_sign_detached(sig.data(), nullptr, msg.data(), msg.size(), sk_.data());
  return sig;
}

}  // namespace grove::transport

// Thin, typed wrappers over libsodium: initialisation, AEAD suites, swarm keys, hashing.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace grove::transport {

constexpr std::size_t kKeySize = 32;
constexpr std::size_t kTagSize = 16;
using Key = std::array<std::uint8_t, kKeySize>;
using Hash256 = std::array<std::uint8_t, 32>;

/// Initialises libsodium once; throws ConfigError if the library cannot start.
void ensure_sodium();

/// AEAD suites for data frames. The handshake negotiates the best one both sides have.
enum class Suite : std::uint8_t {
  aes256gcm = 1,          // when both CPUs have AES-NI + PCLMUL (fastest)
  xchacha20poly1305 = 2,  // always available
};
const char* suite_name(Suite s);
/// Bit mask (1 << Suite) of the suites this CPU can run.
std::uint8_t local_suites();

/// The optional pre-shared swarm key. Stored as 64 hex characters in a file.
struct SwarmKey {
  Key bytes{};
  static SwarmKey generate();
  /// Parses 64 hex characters (surrounding whitespace allowed); throws ConfigError.
  static SwarmKey parse(const std::string& text);
  /// Reads a key file; throws ConfigError with the path and the reason.
  static SwarmKey load(const std::filesystem::path& file);
  std::string hex() const;
};

Hash256 blake2b_256(std::span<const std::uint8_t> data);

/// Incremental BLAKE2b-256: update() any number of times, then final() once.
class Blake2b256 {
 public:
  Blake2b256();
  void update(std::span<const std::uint8_t> data);
  Hash256 final();

 private:
  alignas(64) std::array<std::uint8_t, 384> state_;  // crypto_generichash_state (opaque here)
};
std::string to_hex(std::span<const std::uint8_t> data);

/// One direction of an AEAD channel with an implicit 64-bit counter nonce. Both ends
/// advance the counter once per frame, so a replayed, reordered or dropped frame makes
/// the next open() fail authentication. Not thread-safe: one thread at a time.
class CipherState {
 public:
  CipherState() = default;
  CipherState(Suite suite, const Key& key) : suite_(suite), key_(key) {}
  ~CipherState();
  CipherState(const CipherState&) = default;
  CipherState& operator=(const CipherState&) = default;

  /// Encrypts `data` in place and writes the tag. `ad` is authenticated, not encrypted.
  /// Returns false only if the nonce space is exhausted (the connection must end).
  bool seal(std::span<std::uint8_t> data, std::span<const std::uint8_t> ad, std::uint8_t* tag);
  /// Decrypts `data` in place after checking the tag; false on any mismatch.
  bool open(std::span<std::uint8_t> data, std::span<const std::uint8_t> ad,
            const std::uint8_t* tag);

  Suite suite() const noexcept { return suite_; }
  std::uint64_t counter() const noexcept { return counter_; }

 private:
  void nonce(std::uint8_t* out) const;
  Suite suite_ = Suite::xchacha20poly1305;
  Key key_{};
  std::uint64_t counter_ = 0;
};

}  // namespace grove::transport

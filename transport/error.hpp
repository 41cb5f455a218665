// Error policy (docs/ERRORS.md): peer and network faults are values, never exceptions.
// Every fallible transport operation returns Result<T> or reports a std::error_code
// from grove::transport::errc. Exceptions are reserved for start-up/configuration
// errors (bad key file, unusable listen address) and are thrown as ConfigError.
#pragma once

#include <stdexcept>
#include <string>
#include <system_error>
#include <variant>

namespace grove::transport {

enum class errc {
  ok = 0,
  timed_out = 1,         // a deadline passed (RPC, handshake, stream inactivity)
  cancelled,             // the caller cancelled the operation
  connection_closed,     // the peer or we closed the connection
  connection_truncated,  // the byte stream ended without an authenticated goodbye
  handshake_failed,      // peer could not prove its identity / swarm key mismatch
  wrong_peer,            // the peer authenticated as a different node than expected
  auth_failed,           // a frame failed AEAD verification (tampered, replayed, reordered)
  frame_too_large,       // a frame header announced more than the maximum frame size
  malformed,             // a frame or message could not be decoded within its limits
  protocol_violation,    // well-formed but not allowed in this state
  no_handler,            // the peer has no handler for the requested method / stream kind
  remote_error,          // the peer's handler returned an error
  rejected,              // the peer refused (limits, stream refused)
  limit_reached,         // a local limit (connections, handshakes, streams, queue) was hit
  unreachable,           // dialing failed
  shutting_down,         // the host is closing
  source_failed,         // a stream source could not produce its data
};

const std::error_category& transport_category() noexcept;
std::error_code make_error_code(errc e) noexcept;

/// Thrown only at start-up for configuration errors (never for peer faults).
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Minimal std::expected stand-in (C++20): either a value or an error_code.
template <class T>
class Result {
 public:
  Result(T v) : v_(std::move(v)) {}           // NOLINT
  Result(std::error_code ec) : v_(ec) {}      // NOLINT
  Result(errc e) : v_(make_error_code(e)) {}  // NOLINT
  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  std::error_code error() const noexcept {
    return has_value() ? std::error_code{} : std::get<1>(v_);
  }

 private:
  std::variant<T, std::error_code> v_;
};

template <>
class Result<void> {
 public:
  Result() = default;
  Result(std::error_code ec) : ec_(ec) {}      // NOLINT
  Result(errc e) : ec_(make_error_code(e)) {}  // NOLINT
  bool has_value() const noexcept { return !ec_; }
  explicit operator bool() const noexcept { return has_value(); }
  std::error_code error() const noexcept { return ec_; }

 private:
  std::error_code ec_;
};

}  // namespace grove::transport

namespace std {
template <>
struct is_error_code_enum<grove::transport::errc> : true_type {};
}  // namespace std

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

/// Why an operation failed: a code to act on and, where the code does not say it all, the
/// reason in words (what a log line or a refusal shows).
struct Failure {
  std::error_code code;
  std::string why;
  /// "malformed message: chunk 7 of 3" (the code's message, then the reason if any).
  std::string text() const { return why.empty() ? code.message() : code.message() + ": " + why; }
};

/// Minimal std::expected stand-in (C++20): either a value or a Failure (an error_code and, when
/// given, the reason in words). Every operation on peer input returns one (docs/ERRORS.md).
template <class T>
class Result {
 public:
  Result(T v) : v_(std::move(v)) {}                                      // NOLINT
  Result(std::error_code ec, std::string why = {}) : v_(Failure{ec, std::move(why)}) {}  // NOLINT
  Result(errc e, std::string why = {}) : v_(Failure{make_error_code(e), std::move(why)}) {}  // NOLINT
  Result(Failure f) : v_(std::move(f)) {}                                // NOLINT
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
    return has_value() ? std::error_code{} : std::get<1>(v_).code;
  }
  /// The reason in words ("" on success, or when only the code was given).
  const std::string& why() const noexcept {
    static const std::string none;
    return has_value() ? none : std::get<1>(v_).why;
  }
  Failure failure() const { return has_value() ? Failure{} : std::get<1>(v_); }
  /// The code's message and the reason, for a log line.
  std::string text() const { return has_value() ? std::string() : std::get<1>(v_).text(); }

 private:
  std::variant<T, Failure> v_;
};

template <>
class Result<void> {
 public:
  Result() = default;
  Result(std::error_code ec, std::string why = {}) : f_{ec, std::move(why)} {}  // NOLINT
  Result(errc e, std::string why = {}) : f_{make_error_code(e), std::move(why)} {}  // NOLINT
  Result(Failure f) : f_(std::move(f)) {}                                        // NOLINT
  bool has_value() const noexcept { return !f_.code; }
  explicit operator bool() const noexcept { return has_value(); }
  std::error_code error() const noexcept { return f_.code; }
  const std::string& why() const noexcept { return f_.why; }
  Failure failure() const { return f_; }
  std::string text() const { return has_value() ? std::string() : f_.text(); }

 private:
  Failure f_;
};

}  // namespace grove::transport

namespace std {
template <>
struct is_error_code_enum<grove::transport::errc> : true_type {};
}  // namespace std

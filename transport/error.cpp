#include "transport/error.hpp"

namespace grove::transport {
namespace {
class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "grove.transport"; }
  std::string message(int v) const override {
    switch (static_cast<errc>(v)) {
      case errc::ok:
        return "ok";
      case errc::timed_out:
        return "deadline exceeded";
      case errc::cancelled:
        return "cancelled";
      case errc::connection_closed:
        return "connection closed";
      case errc::connection_truncated:
        return "connection truncated (no authenticated goodbye)";
      case errc::handshake_failed:
        return "handshake failed";
      case errc::wrong_peer:
        return "peer identity does not match the expected node id";
      case errc::auth_failed:
        return "frame authentication failed (tampered, replayed or reordered)";
      case errc::frame_too_large:
        return "frame exceeds the maximum frame size";
      case errc::malformed:
        return "malformed frame or message";
      case errc::protocol_violation:
        return "protocol violation";
      case errc::no_handler:
        return "no handler for this method or stream kind";
      case errc::remote_error:
        return "remote handler failed";
      case errc::rejected:
        return "rejected by peer";
      case errc::limit_reached:
        return "local limit reached";
      case errc::unreachable:
        return "peer unreachable";
      case errc::shutting_down:
        return "host shutting down";
      case errc::source_failed:
        return "stream source failed";
    }
    return "unknown transport error";
  }
};
}  // namespace

const std::error_category& transport_category() noexcept {
  static const Category c;
  return c;
}

std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), transport_category()};
}

}  // namespace grove::transport

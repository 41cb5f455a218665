// Relays: how two nodes that both accept no connections reach each other.
//
// A node that accepts no connections (transport/reach.hpp) reserves a slot at one or two
// reachable members ("relay.reserve" over the session it keeps open with them) and advertises
// "relay:<relay id>@<relay address>". A node that wants to reach it asks that relay
// ("relay.connect"); the relay draws a one-time token, tells the unreachable node over its
// reserved session ("relay.incoming"), and both ends open a fresh TCP connection to the relay
// that starts with a preamble carrying the token instead of a handshake. The relay pairs the
// two sockets by token and copies bytes between them; the two ends then run the ordinary
// handshake through it, the dialer expecting the other's identity, so the session between them
// is encrypted and authenticated end to end: the relay sees only the handshake and ciphertext,
// and cannot pose as either end (the same idea as TURN's TCP allocations, RFC 6062).
//
// When the node that wants the connection is reachable itself, it first tries connection
// reversal: it asks the relay to pass its (verified) addresses on ("relay.reverse" →
// "relay.dialback"), the unreachable node dials it directly, and no relay bandwidth is used.
// The relay passes on only addresses at the IP it sees the asker at, so nobody can make an
// unreachable node dial a third party. When no direct session arrives within a few seconds
// the asker opens a relayed circuit as above.
//
// A relay is bounded: reservations, circuits at once, bytes a second over all its circuits,
// bytes per circuit, the time a token waits for its second socket. A circuit whose end closes,
// or that reaches a limit, is closed on both sides: to the two nodes it is a cut connection.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "transport/error.hpp"
#include "transport/identity.hpp"

namespace grove::transport {

inline constexpr const char* kRelayReserve = "relay.reserve";
inline constexpr const char* kRelayConnect = "relay.connect";
inline constexpr const char* kRelayIncoming = "relay.incoming";
/// Connection reversal: a reachable node asks the relay ("relay.reverse") to pass its addresses
/// to the unreachable node ("relay.dialback"), which then dials it directly; no circuit.
inline constexpr const char* kRelayReverse = "relay.reverse";
inline constexpr const char* kRelayDialBack = "relay.dialback";
inline constexpr std::size_t kDialBackMaxAddresses = 4;
inline constexpr std::size_t kDialBackMaxAddress = 200;  ///< bytes of one "host:port"
/// The body of relay.reverse (`node` = the unreachable node to be asked) and of relay.dialback
/// (`node` = the node to dial): [1, bin32 node, [address...]].
struct RelayDialBack {
  NodeId node{};
  std::vector<std::string> addresses;  ///< 1 to kDialBackMaxAddresses
};
std::vector<std::uint8_t> encode_relay_dialback(const RelayDialBack& d);
Result<RelayDialBack> decode_relay_dialback(std::span<const std::uint8_t> body);
using RelayToken = std::array<std::uint8_t, 16>;
/// [u16 length]["GRVR"][version 1][token]: what a relayed connection starts with.
inline constexpr std::size_t kRelayPreamble = 4 + 1 + 16;
std::vector<std::uint8_t> relay_preamble(const RelayToken& t);
/// The token of a preamble's body (without the length), if it is one.
std::optional<RelayToken> parse_relay_preamble(std::span<const std::uint8_t> body);

/// "relay:<64 hex digits of the relay's id>@<relay address>" and back.
std::string relay_address(const NodeId& relay, const std::string& relay_addr);
bool parse_relay_address(const std::string& a, NodeId& relay, std::string& relay_addr);

struct RelayOptions {
  bool serve = true;                  ///< act as a relay for others (--no-relay: false)
  std::size_t max_reservations = 64;  ///< unreachable nodes reserved here
  std::size_t max_circuits = 16;      ///< spliced pairs at once
  double bytes_per_sec = 12.5e6;      ///< over all circuits together (100 Mbit/s); 0 = any
  std::uint64_t max_circuit_bytes = 8ull << 30;    ///< per circuit, both directions
  std::chrono::milliseconds pair_timeout{10'000};  ///< a token waits this long for both ends
};

struct RelayStats {
  std::size_t reservations = 0, circuits = 0;
  std::uint64_t circuits_total = 0, bytes = 0, refused = 0;
  std::uint64_t reversals = 0;  ///< dial-back requests passed on (relay.reverse)
};

/// The relay's side; every call on the host strand.
class RelayServer : public std::enable_shared_from_this<RelayServer> {
 public:
  using tcp = boost::asio::ip::tcp;
  RelayServer(boost::asio::any_io_executor strand, RelayOptions o);
  ~RelayServer();

  /// A reservation for `node` (false when full). It lasts until drop().
  bool reserve(const NodeId& node);
  void drop(const NodeId& node);
  void count_reversal() { ++stats_.reversals; }
  bool reserved(const NodeId& node) const { return reserved_.contains(node); }
  /// A token for a circuit from `from` to `to`, or why not.
  Result<RelayToken> open(const NodeId& from, const NodeId& to);
  /// A socket that presented `token`: the first of a pair waits, the second starts the splice.
  void on_socket(tcp::socket s, const RelayToken& token);
  /// Closes every circuit and pending socket.
  void close();
  RelayStats stats() const;

 private:
  class Circuit;
  struct Pending {
    std::unique_ptr<tcp::socket> first;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  /// Waits until the shared rate allows `n` more bytes, then runs `go`.
  void pace(std::size_t n, std::function<void()> go);
  void circuit_done(Circuit* c, std::uint64_t bytes);

  boost::asio::any_io_executor strand_;
  RelayOptions opts_;
  std::set<NodeId> reserved_;
  std::map<RelayToken, Pending> pending_;
  std::map<Circuit*, std::shared_ptr<Circuit>> circuits_;
  RelayStats stats_;
  double allowance_ = 0;  ///< bytes the rate allows now (token bucket)
  std::chrono::steady_clock::time_point refilled_;
  bool closed_ = false;
};

}  // namespace grove::transport

// Fuzz target for the DHT message handler (dht/node.hpp) and the DHT wire codec
// (dht/messages.hpp).
//
// One persistent bare dht::DhtNode (fixed identity and seed, address "me:1", default options)
// receives every input as a message from one of a few fixed peers; see dht_fuzz.hpp for the
// input layout. Every kTimerEvery inputs the harness calls on_timer and starts one of the node's
// own operations (find_node, get, put_signed, ping) so that requests are in flight and replies in
// reply mode reach the lookup, paging and store paths. The node is recreated, with its clock
// back at kEpoch, every kRecreateEvery inputs (memory stays bounded and seed records stay
// unexpired).
//
// Properties checked (a violation traps, so libFuzzer records a crash):
//   - nothing the node sends fails to decode, and decoding and re-encoding it gives its bytes;
//   - every message it sends carries its own address; requests carry the txid it reports for
//     on_send_failed, replies (txid 0) only answer the peer whose message is being handled;
//   - lookup results hold at most k distinct nodes, nearest first, never the node itself; a
//     get returns records of its key only;
//   - dht::decode on the input (whole, and without the selector byte) never crashes; what it
//     accepts re-encodes to bytes it accepts again and that re-encode identically; what it
//     accepts under small limits it also accepts under the default ones.
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "dht/node.hpp"
#include "tests/fuzz/dht_fuzz.hpp"

namespace {
using namespace grove;
using namespace grove::fuzz::dht_fuzz;
using dht::Time;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr std::size_t kRecreateEvery = 10'000;
constexpr std::size_t kTimerEvery = 8;
constexpr std::size_t kMaxPending = 256;

/// The request a reply of this type answers (nullopt: any, for error and for requests).
std::optional<dht::MsgType> request_of(dht::MsgType reply) {
  switch (reply) {
    case dht::MsgType::pong:
      return dht::MsgType::ping;
    case dht::MsgType::nodes:
      return dht::MsgType::find_node;
    case dht::MsgType::value:
      return dht::MsgType::find_value;
    case dht::MsgType::stored:
      return dht::MsgType::store;
    default:
      return std::nullopt;
  }
}

void check_lookup(const dht::NodeId& self, const dht::Key& target, const dht::LookupResult& r,
                  std::size_t k) {
  check(r.closest.size() <= k);
  check(r.queried >= r.closest.size());
  check(r.closest.empty() || r.hops >= 1);
  for (std::size_t i = 0; i < r.closest.size(); ++i) {
    check(r.closest[i].id != self);
    if (i > 0) check(dht::closer(target, r.closest[i - 1].id, r.closest[i].id));
  }
}

class Harness {
 public:
  Harness() : self_(std::make_shared<transport::Identity>(node_identity())) {
    spdlog::set_level(spdlog::level::off);  // malformed-message warnings would flood the log
    for (std::size_t i = 0; i < kPeers; ++i) peers_.push_back(peer_identity(i).id());
    reset();
  }

  void run(std::span<const std::uint8_t> in) {
    if (inputs_ == kRecreateEvery) reset();
    ++inputs_;
    const std::uint8_t sel = in.empty() ? 0 : in[0];
    const auto rest = in.empty() ? in : in.subspan(1);
    now_ += Time(sel >> kAdvanceShift);
    const std::size_t p = sel & kPeerMask;
    const dht::Peer from{peers_[p], peer_address(p)};
    if ((sel & kReplyBit) && !pending_.empty())
      reply(sel, from, rest);
    else
      deliver(from, rest);
    if (inputs_ % kTimerEvery == 0) tick();
  }

 private:
  struct Pending {
    std::uint64_t txid = 0;
    std::optional<dht::NodeId> to;
    dht::MsgType type = dht::MsgType::ping;
  };

  void reset() {
    node_ = std::make_unique<dht::DhtNode>(self_, kSelfAddress, dht::DhtOptions{}, kNodeSeed);
    now_ = kEpoch;
    inputs_ = 0;
    ticks_ = 0;
    rng_.seed(kNodeSeed);
    pending_.clear();
  }

  void deliver(const dht::Peer& from, std::span<const std::uint8_t> bytes) {
    node_->on_message(from, bytes, now_);
    drain(from.id);
  }

  // Reply mode: answer (or fail) one of the requests the node sent.
  void reply(std::uint8_t sel, const dht::Peer& peer, std::span<const std::uint8_t> rest) {
    const std::size_t pick = sel >> kAdvanceShift;
    if (rest.empty()) {
      const Pending& p = pending_[pending_.size() - 1 - pick % pending_.size()];
      node_->on_send_failed(p.txid, now_);
      return drain(std::nullopt);
    }
    auto m = dht::decode(rest, node_->options().wire);
    if (!m) return deliver(peer, rest);
    const auto want = request_of(m->type);
    std::vector<const Pending*> match;  // most recent first
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it)
      if (!want || it->type == *want) match.push_back(&*it);
    if (match.empty())  // none of the type: a reply of the wrong type to any request
      for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) match.push_back(&*it);
    const Pending& p = *match[pick % match.size()];
    m->txid = p.txid;
    const dht::Peer from = p.to ? dht::Peer{*p.to, "reply:1"} : peer;
    const auto bytes = dht::encode(*m);
    deliver(from, bytes);
  }

  // The timer, then one of the node's own operations.
  void tick() {
    ++ticks_;
    node_->on_timer(now_);
    drain(std::nullopt);
    const dht::Key key = fuzz_key((ticks_ / 4) % kKeys);
    const dht::NodeId self = self_->id();
    const std::size_t k = node_->options().k;
    switch (ticks_ % 4) {
      case 1: {
        const dht::Key target = dht::random_key(rng_);
        node_->find_node(target, now_, [self, target, k](dht::LookupResult r) {
          check_lookup(self, target, r, k);
        });
        break;
      }
      case 2: {
        dht::GetOptions go;
        go.quorum = (ticks_ / 4) % 2 ? 0 : 3;
        node_->get(
            key, now_,
            [self, key, k](dht::GetResult g) {
              check_lookup(self, key, g.lookup, k);
              for (const auto& r : g.records) check(r.key == key);
            },
            go);
        break;
      }
      case 3: {
        std::vector<std::uint8_t> value(16 + ticks_ % 64, static_cast<std::uint8_t>(ticks_));
        node_->put_signed(key, "harness", ticks_, now_ + kRecordTtl, std::move(value), now_,
                          [](dht::PutResult r) { check(r.acked <= r.tried); });
        break;
      }
      default: {
        // A ping to a peer by id and address, or (every other time) by address alone.
        const std::size_t p = (ticks_ / 4) % kPeers;
        dht::Endpoint to{peers_[p], peer_address(p)};
        if ((ticks_ / 4) % 2) to.id.reset();
        node_->ping(to, now_, [](bool) {});
        break;
      }
    }
    drain(std::nullopt);
  }

  // Everything the node sends must be a well-formed message of ours.
  void drain(const std::optional<dht::NodeId>& handling) {
    for (auto& o : node_->take_outgoing()) {
      auto m = dht::decode(o.bytes, node_->options().wire);
      check(m.has_value());
      check(m->sender_address == kSelfAddress);
      check(dht::encode(*m) == o.bytes);
      if (o.txid != 0) {
        check(dht::is_request(m->type));
        check(m->txid == o.txid);
        pending_.push_back({o.txid, o.to.id, m->type});
        if (pending_.size() > kMaxPending) pending_.pop_front();
      } else {
        check(!dht::is_request(m->type));
        check(handling.has_value() && o.to.id == handling);
      }
    }
  }

  std::shared_ptr<const transport::Identity> self_;
  std::vector<dht::NodeId> peers_;
  std::unique_ptr<dht::DhtNode> node_;
  Time now_{0};
  std::size_t inputs_ = 0;
  std::size_t ticks_ = 0;
  std::mt19937_64 rng_;
  std::deque<Pending> pending_;
};

dht::WireLimits small_limits() {
  dht::WireLimits l;
  l.max_message = 4096;
  l.max_contacts = 4;
  l.max_records = 4;
  l.max_store_records = 2;
  l.max_address = 16;
  l.record.max_subkey = 8;
  l.record.max_value = 64;
  return l;
}

void check_decode(std::span<const std::uint8_t> in) {
  static const dht::WireLimits defaults{};
  static const dht::WireLimits small = small_limits();
  for (const auto* lim : {&defaults, &small}) {
    auto m = dht::decode(in, *lim);
    if (!m) continue;
    if (lim == &small) check(dht::decode(in, defaults).has_value());
    const auto enc = dht::encode(*m);
    auto again = dht::decode(enc, *lim);
    check(again.has_value());
    check(again->type == m->type && again->txid == m->txid);
    check(dht::encode(*again) == enc);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Harness harness;
  const std::span<const std::uint8_t> in(data, size);
  check_decode(in);
  if (!in.empty()) check_decode(in.subspan(1));
  harness.run(in);
  return 0;
}

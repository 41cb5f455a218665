// Internal to DhtNode's source files (node.cpp, node_lookup.cpp): the state of an RPC, a lookup
// and a put in flight.
#pragma once

#include "dht/node.hpp"

namespace grove::dht {

// ---------------------------------------------------------------------------------------------
// Internal state

struct DhtNode::Rpc {
  std::uint64_t txid = 0;
  Endpoint to;
  std::vector<std::uint8_t> bytes;
  Time deadline{0};
  int retries_left = 0;
  std::function<void(const Peer&, Message&)> on_reply;
  std::function<void()> on_fail;
  std::function<void()> on_slow;
};

struct DhtNode::Lookup {
  enum class St { fresh, inflight, slow, done, failed };
  struct Cand {
    Contact c;
    St st = St::fresh;
    std::size_t hop = 1;
    std::size_t pages = 0;
    bool values = true;  ///< spread gets: false while asked for contacts only
    bool drawn = false;  ///< spread gets: whether to ask for records was decided
  };
  std::uint64_t id = 0;
  Key target{};
  bool values = false;
  std::size_t quorum = 0;
  bool spread = false;
  Time deadline{0};
  std::map<Key, Cand> cands;  // by XOR distance to target: nearest first
  std::size_t inflight = 0;
  std::size_t queried = 0;
  std::map<std::pair<PublicKey, std::string>, Record> found;
  std::size_t responders = 0;
  bool finished = false;
  std::function<void(Lookup&)> done;
};

struct DhtNode::PutOp {
  std::size_t pending = 0;
  PutResult result;
  PutCallback done;
};

}  // namespace grove::dht

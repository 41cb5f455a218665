// The record store as the layers above the DHT see it: signed records under keys, our identity
// and the time. Membership, matchmaking, catch-up, the mode schedule and the round engine use
// only this; the Kademlia node (dht/node.hpp) implements it for the node and the simulator, and
// tests implement it with a map (tests/gossip/fake_store.hpp) to exercise round logic without a
// swarm. Sans-IO like its users: the times are given, and a read's or write's callback runs later
// from the store's own driving (never from inside the call).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dht/record.hpp"

namespace grove::dht {

struct GetOptions {
  /// Stop once this many nodes returned records and no closer unqueried node is left in the
  /// top `quorum`; 0 = visit the k closest (every writer of a dictionary is seen).
  std::size_t quorum = 0;
  /// With a quorum: read from about `quorum` holders drawn at random among the k closest
  /// instead of the nearest ones (a key every member reads often, like the members'
  /// dictionary, then loads all its k holders alike). Costs contact-only requests to the others.
  bool spread = false;
};

class RecordStore {
 public:
  using ReadDone = std::function<void(std::vector<Record>)>;
  /// Whether some node holds the record now (or we keep it, being among the nearest to its key).
  using WriteDone = std::function<void(bool stored)>;

  virtual ~RecordStore() = default;
  /// Our node id (the owner of the records we write).
  virtual const NodeId& id() const = 0;
  /// The latest time the store was given.
  virtual Time now() const = 0;

  /// The newest valid record of every slot under `key` that could be found (possibly none).
  void read(const Key& key, Time now, ReadDone done, GetOptions opts = {}) {
    do_read(key, now, std::move(done), opts);
  }
  /// Signs a record of ours (`seq` must grow per key and subkey) and stores it until `expires`;
  /// returns the record. `done` runs once the store has tried.
  Record write(const Key& key, std::string subkey, std::uint64_t seq, Time expires,
               std::vector<std::uint8_t> value, Time now, WriteDone done = {}) {
    return do_write(key, std::move(subkey), seq, expires, std::move(value), now, std::move(done));
  }

 protected:
  virtual void do_read(const Key& key, Time now, ReadDone done, GetOptions opts) = 0;
  virtual Record do_write(const Key& key, std::string subkey, std::uint64_t seq, Time expires,
                          std::vector<std::uint8_t> value, Time now, WriteDone done) = 0;
};

}  // namespace grove::dht

// A record store in memory for unit tests of the round logic: every FakeStore on one Board sees
// the records the others wrote (signed, as the DHT's), without a swarm, a routing table or a
// network. Reads and writes complete at the next deliver(), as the DHT's callbacks come from its
// own driving and never from inside the call. Expired records are not returned.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "dht/record_store.hpp"
#include "transport/identity.hpp"

namespace grove::test {

struct Board {
  std::map<std::tuple<dht::Key, dht::PublicKey, std::string>, dht::Record> records;
  std::size_t reads = 0, writes = 0;
  /// The live records under `key` (of every owner and subkey).
  std::vector<dht::Record> at(const dht::Key& key, dht::Time now) const {
    std::vector<dht::Record> out;
    for (const auto& [slot, r] : records)
      if (std::get<0>(slot) == key && r.expires > now) out.push_back(r);
    return out;
  }
};

class FakeStore final : public dht::RecordStore {
 public:
  explicit FakeStore(std::shared_ptr<Board> board)
      : board_(std::move(board)), identity_(transport::Identity::generate()) {}
  const dht::NodeId& id() const override { return identity_.id(); }
  dht::Time now() const override { return now_; }
  const transport::Identity& identity() const { return identity_; }

  /// Advances the time and runs the callbacks of the reads and writes made before.
  void deliver(dht::Time now) {
    now_ = now;
    auto due = std::exchange(due_, {});
    for (auto& f : due) f();
  }

 protected:
  void do_read(const dht::Key& key, dht::Time now, ReadDone done, dht::GetOptions) override {
    now_ = std::max(now_, now);
    ++board_->reads;
    due_.push_back([this, key, done = std::move(done)] { done(board_->at(key, now_)); });
  }
  dht::Record do_write(const dht::Key& key, std::string subkey, std::uint64_t seq,
                       dht::Time expires, std::vector<std::uint8_t> value, dht::Time now,
                       WriteDone done) override {
    now_ = std::max(now_, now);
    ++board_->writes;
    auto r = dht::make_record(identity_, key, std::move(subkey), seq, expires, std::move(value));
    auto& slot = board_->records[{r.key, r.owner, r.subkey}];
    if (slot.seq <= r.seq) slot = r;
    if (done) due_.push_back([done = std::move(done)] { done(true); });
    return r;
  }

 private:
  std::shared_ptr<Board> board_;
  transport::Identity identity_;
  dht::Time now_{0};
  std::vector<std::function<void()>> due_;
};

}  // namespace grove::test

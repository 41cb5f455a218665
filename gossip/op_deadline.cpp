#include "gossip/op_deadline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gossip/allreduce.hpp"
#include "gossip/exchange.hpp"

namespace grove::gossip {

std::uint64_t exchange_wire_bytes(WireCodec codec, std::uint64_t values_per_member,
                                  std::size_t partners) {
  return encoded_size(codec, values_per_member) * partners;
}

std::uint64_t allreduce_wire_bytes(WireCodec codec, std::uint64_t values, std::size_t members) {
  if (members < 2) return 0;
  return 2 * encoded_size(codec, values) * (members - 1) / members;
}

void OpDeadlines::observe(std::uint64_t bytes, Time took) {
  if (bytes == 0 || took.count() <= 0) return;
  const double r = static_cast<double>(bytes) * 1000.0 / static_cast<double>(took.count());
  measured_ = measured_ > 0 ? 0.5 * measured_ + 0.5 * r : r;
}

std::uint64_t allgather_wire_bytes(const GatherCodec& codec, std::uint64_t values,
                                   std::size_t members) {
  return members > 1 ? (members - 1) * codec.encoded_size(values) : 0;
}

void OpDeadlines::observe(const Protocol& op, Time took) {
  // The tensor bytes the op moved, as deadline_for() is asked for them (heartbeats and headers
  // left out: they are not what takes the time).
  if (const auto* ex = dynamic_cast<const GroupExchange*>(&op); ex && !ex->completed().empty()) {
    std::uint64_t values = 0;
    for (const auto& t : ex->mean()) values += t.size();
    observe(exchange_wire_bytes(ex->options().codec, values, ex->completed().size()), took);
  }
  if (const auto* ar = dynamic_cast<const RingAllReduce*>(&op);
      ar && ar->status() == OpStatus::done && ar->members().size() > 1)
    observe(allreduce_wire_bytes(ar->options().codec, ar->result().size(), ar->members().size()),
            took);
  if (const auto* ag = dynamic_cast<const RingAllGather*>(&op);
      ag && ag->status() == OpStatus::done && ag->members().size() > 1)
    observe(allgather_wire_bytes(ag->options().codec, ag->result().size(), ag->members().size()),
            took);
}

double OpDeadlines::rate() const {
  return std::max(measured_, o_.min_rate);
}

Time OpDeadlines::deadline_for(std::uint64_t bytes) const {
  const double ms = o_.margin * static_cast<double>(bytes) * 1000.0 / rate();
  return o_.floor + Time(static_cast<std::int64_t>(std::ceil(std::min(ms, 1e15))));
}

Time OpDeadlines::silence_for(std::uint64_t bytes, Time floor, std::uint64_t op_bytes) const {
  if (!measured()) return floor;  // the assumed rate is a guess: the configured floor stands
  const double ms =
      std::max(o_.margin * static_cast<double>(bytes), static_cast<double>(op_bytes) / 5.0) *
      1000.0 / rate();
  return std::max(floor, Time(static_cast<std::int64_t>(std::ceil(std::min(ms, 1e15)))));
}

std::string OpDeadlines::describe(std::uint64_t bytes) const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "deadline %.0f s (%.2f GB at %.1f MB/s %s, x%g, floor %.0f s)",
                static_cast<double>(deadline_for(bytes).count()) / 1000.0,
                static_cast<double>(bytes) / 1e9, rate() / 1e6,
                measured() && measured_ >= o_.min_rate ? "measured" : "assumed", o_.margin,
                static_cast<double>(o_.floor.count()) / 1000.0);
  return buf;
}

}  // namespace grove::gossip

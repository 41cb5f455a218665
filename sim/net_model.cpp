#include "sim/net_model.hpp"

#include <cmath>
#include <stdexcept>

namespace grove::sim {

namespace {
template <class T>
std::size_t draw(const std::vector<T>& items, std::mt19937_64& rng) {
  double total = 0;
  for (const auto& it : items) total += it.share;
  if (items.empty() || total <= 0) throw std::invalid_argument("NetModel: nothing to draw from");
  double x = std::uniform_real_distribution<double>(0, total)(rng);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (x < items[i].share) return i;
    x -= items[i].share;
  }
  return items.size() - 1;
}
}  // namespace

NetModel NetModel::uniform(double rtt_ms, double mbit, double loss) {
  NetModel m;
  m.regions = {{"wan", 1}};
  m.rtt_ms = {{rtt_ms}};
  m.access = {{"node", 1, mbit, mbit, 0}};
  m.loss = loss;
  return m;
}

NetModel NetModel::world() {
  NetModel m;
  m.regions = {{"us-east", 3}, {"us-west", 2}, {"europe", 3}, {"asia", 2}};
  // Round figures of the RTTs that public inter-region ping tables of cloud providers show
  // (same region a few ms; US coast to coast ~65 ms; US east–Europe ~75; US west–Europe ~140;
  // US west–Tokyo ~100; US east–Tokyo ~150; Europe–Tokyo ~220).
  m.rtt_ms = {{4, 65, 75, 150}, {65, 4, 140, 100}, {75, 140, 4, 220}, {150, 100, 220, 4}};
  m.access = {{"cloud", 3, 1000, 1000, 0}, {"lab", 3, 500, 500, 1}, {"home", 4, 20, 200, 6}};
  m.jitter_ms = 2;
  m.loss = 0.001;
  return m;
}

NetModel::Placement NetModel::place(std::mt19937_64& rng) const {
  Placement p;
  p.region = draw(regions, rng);
  p.access = draw(access, rng);
  return p;
}

dht::Time NetModel::one_way(const Placement& a, const Placement& b) const {
  const double ms = rtt_ms.at(a.region).at(b.region) / 2 + access.at(a.access).last_mile_ms +
                    access.at(b.access).last_mile_ms;
  return dht::Time(static_cast<std::int64_t>(std::llround(ms)));
}

}  // namespace grove::sim

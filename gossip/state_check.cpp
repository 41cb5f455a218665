#include "gossip/state_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dht/key.hpp"
#include "optim/splitmix.hpp"
#include "optim/state_format.hpp"
#include "transport/schema.hpp"

namespace grove::gossip {

namespace {
namespace sc = transport::schema;
using transport::errc;

// A probe travels as a "state" request of version 2 (a chunk request is version 1): the server
// tells them apart by the version alone.
constexpr auto kProbeSchema =
    sc::record<StateProbe>("state probe", 2, sc::field("round", &StateProbe::round, sc::Uint{}),
                           sc::field("seed", &StateProbe::seed, sc::Uint{}),
                           sc::field("samples", &StateProbe::samples, sc::Uint{kProbeSamples}));

struct AnswerWire {
  std::uint64_t round = 0;
  Digest hash{};
  std::uint64_t sampled = 0, values = 0;
  std::vector<std::uint8_t> samples;  // little-endian float32
};
constexpr auto kAnswerSchema = sc::record<AnswerWire>(
    "state probe answer", 1, sc::field("round", &AnswerWire::round, sc::Uint{}),
    sc::field("hash", &AnswerWire::hash, sc::Bin{32}),
    sc::field("sampled", &AnswerWire::sampled, sc::Uint{}),
    sc::field("values", &AnswerWire::values, sc::Uint{}),
    sc::field("samples", &AnswerWire::samples, sc::Bin{4 * kProbeSamples}));

std::uint64_t load_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

float load_f32(const std::uint8_t* p) {
  const std::uint32_t u = static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                          static_cast<std::uint32_t>(p[2]) << 16 |
                          static_cast<std::uint32_t>(p[3]) << 24;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool zero(const Digest& d) {
  return std::all_of(d.begin(), d.end(), [](std::uint8_t b) { return b == 0; });
}

std::string hex(const Digest& d) {
  return transport::to_hex(std::span(d).first(4));
}

double dist(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}
}  // namespace

std::vector<std::uint8_t> encode_probe(const StateProbe& p) {
  return sc::encode(kProbeSchema, p);
}

transport::Result<StateProbe> decode_probe(std::span<const std::uint8_t> bytes) {
  return sc::decode(kProbeSchema, bytes);
}

std::vector<std::uint8_t> encode_probe_answer(const ProbeAnswer& a) {
  AnswerWire w{a.round, a.hash, a.sampled, a.values, {}};
  w.samples.resize(4 * std::min<std::size_t>(a.samples.size(), kProbeSamples));
  for (std::size_t i = 0; i < w.samples.size() / 4; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &a.samples[i], 4);
    for (int b = 0; b < 4; ++b) w.samples[4 * i + b] = static_cast<std::uint8_t>(u >> (8 * b));
  }
  return sc::encode(kAnswerSchema, w);
}

transport::Result<ProbeAnswer> decode_probe_answer(std::span<const std::uint8_t> bytes) {
  auto w = sc::decode(kAnswerSchema, bytes);
  if (!w) return w.error();
  if (w->samples.size() % 4) return {errc::malformed, "state probe answer: a partial value"};
  ProbeAnswer a{w->round, w->hash, w->sampled, w->values, {}};
  for (std::size_t i = 0; i < w->samples.size(); i += 4) {
    const float f = load_f32(&w->samples[i]);
    if (!std::isfinite(f)) return {errc::malformed, "state probe answer: a value not finite"};
    a.samples.push_back(f);
  }
  return a;
}

std::vector<std::uint64_t> sample_positions(std::uint64_t seed, std::uint64_t values,
                                            std::uint32_t n) {
  std::vector<std::uint64_t> at;
  if (values == 0) return at;
  for (std::uint32_t i = 0; i < n; ++i)
    at.push_back(optim::splitmix64(seed + i * optim::kSplitmixGamma) % values);
  return at;
}

transport::Result<Samples> read_samples(const StateBlob& blob, std::uint64_t seed,
                                        std::uint32_t n) {
  using optim::kPhiCountOffset, optim::kPhiValuesOffset, optim::kRoundOffset;
  std::uint8_t head[kPhiValuesOffset];
  if (auto r = blob.read(0, head); !r) return r.error();
  if (!optim::is_state_form(head)) return {errc::malformed, "not a state blob"};
  Samples s;
  s.round = load_le64(head + kRoundOffset);
  s.values = load_le64(head + kPhiCountOffset);
  if (s.values > (blob.size() - kPhiValuesOffset) / 4)
    return {errc::malformed, "a state blob too short"};
  for (const std::uint64_t i : sample_positions(seed, s.values, n)) {
    std::uint8_t b[4];
    if (auto r = blob.read(kPhiValuesOffset + 4 * i, b); !r) return r.error();
    s.at.push_back(load_f32(b));
  }
  return s;
}

StateVerdict judge_state(const StateToJudge& s, std::span<const Witness> witnesses) {
  StateVerdict v;
  const std::string donor = dht::short_hex(s.donor);
  // Members besides the donor that answered and hold a state (of our size): only they can vouch
  // for it. When none does (the donor is the only other member with a state: a swarm of two, or
  // a bootstrap node with joiners), the donor's word is all there is.
  const bool others_hold = std::any_of(witnesses.begin(), witnesses.end(), [&](const Witness& w) {
    return w.who != s.donor && w.answer &&
           ((w.answer->values > 0 && w.answer->values == s.phi.size()) || !zero(w.answer->hash));
  });
  std::string said;    // every witness's answer, for the log
  std::string prefix;  // DiLoCo, when only the donor reports the round: what they said
  const auto note = [&](const Witness& w, const std::string& what) {
    said += (said.empty() ? "" : ", ") + dht::short_hex(w.who) + ": " + what;
  };
  // The donor must stand by the state it served (a member reports the hash of each of its
  // recent states).
  for (const auto& w : witnesses)
    if (w.who == s.donor && w.answer && !zero(w.answer->hash) && w.answer->round == s.round &&
        w.answer->hash != s.hash) {
      v.detail = "its donor " + donor + " reports another hash (" + hex(w.answer->hash) +
                 ") for round " + std::to_string(s.round) + " than the state it served (" +
                 hex(s.hash) + ")";
      return v;
    }
  if (s.same_hash) {
    std::size_t reporters = 0, agree = 0, others_agree = 0;
    for (const auto& w : witnesses) {
      if (!w.answer) {
        note(w, "no answer" + (w.failure.empty() ? std::string() : " (" + w.failure + ")"));
        continue;
      }
      if (w.answer->round != s.round || zero(w.answer->hash)) {
        note(w, w.answer->values == 0 ? "holds no state"
                                      : "does not hold round " + std::to_string(s.round));
        continue;
      }
      ++reporters;
      const bool same = w.answer->hash == s.hash;
      agree += same;
      others_agree += same && w.who != s.donor;
      note(w, same ? "same hash" : "hash " + hex(w.answer->hash));
    }
    const std::string count = std::to_string(agree) + " of " + std::to_string(reporters) +
                              " members reporting round " + std::to_string(s.round) + " (" + said +
                              ")";
    if (reporters == 0 && !others_hold) {  // (the donor did not answer; nobody else can say)
      v.accepted = true;
      v.detail = "no other member that answered holds a state (" + said + ")";
      return v;
    }
    if (2 * agree <= reporters) {
      v.detail = "its hash " + hex(s.hash) + " is reported by " + count;
      return v;
    }
    if (others_agree > 0 || !others_hold) {
      v.accepted = true;
      v.detail = "checked against " + count;
      return v;
    }
    // Only its donor holds the round (it ended it alone: the others will catch up from it, or it
    // lies): its values must lie near the other members', as a NoLoCo state's.
    prefix = "no member but its donor " + donor + " reports round " + std::to_string(s.round) +
             " (" + said + "); ";
    said.clear();
  }
  // The state's values at the sampled positions against the other members'.
  std::vector<std::vector<float>> others;
  for (const auto& w : witnesses) {
    if (w.who == s.donor) {
      note(w, !w.answer ? "its donor, no answer"
              : w.answer->hash == s.hash
                  ? "its donor, same hash"
                  : "its donor, no longer holds round " + std::to_string(s.round));
      continue;
    }
    if (!w.answer) {
      note(w, "no answer" + (w.failure.empty() ? std::string() : " (" + w.failure + ")"));
    } else if (w.answer->values != s.phi.size() || w.answer->samples.size() != kProbeSamples) {
      note(w, w.answer->values == 0 ? "holds no state" : "no samples of a state of our size");
    } else {
      others.push_back(w.answer->samples);
      note(w, "round " + std::to_string(w.answer->sampled));
    }
  }
  if (others.empty()) {
    if (!others_hold) {
      v.accepted = true;
      v.detail =
          prefix + "its donor " + donor + " is the only other member with a state (" + said + ")";
      return v;
    }
    v.detail = prefix + "no member but its donor " + donor + " could be compared (" + said + ")";
    return v;
  }
  std::vector<float> ours;
  for (const std::uint64_t i : sample_positions(s.seed, s.phi.size(), kProbeSamples))
    ours.push_back(s.phi[i]);
  std::vector<float> center(kProbeSamples);
  for (std::uint32_t k = 0; k < kProbeSamples; ++k) {
    std::vector<double> col;
    for (const auto& o : others) col.push_back(o[k]);
    center[k] = static_cast<float>(median(std::move(col)));
  }
  std::vector<double> spread;
  for (const auto& o : others) spread.push_back(dist(o, center));
  const double norm = dist(center, std::vector<float>(kProbeSamples, 0.0f));
  const double bound = 4 * median(spread) + 0.75 * norm;
  const double d = dist(ours, center);
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "its values lie %.3g from the median of %zu other members' (bound %.3g: their "
                "spread %.3g, norm %.3g)",
                d, others.size(), bound, median(spread), norm);
  v.accepted = d <= bound;
  v.detail = prefix + buf + " (" + said + ")";
  return v;
}

}  // namespace grove::gossip

#include "gossip/state_delta.hpp"

#include <algorithm>
#include <cstring>

#include "gossip/step_work.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

using transport::errc;

namespace {
constexpr char kMagic[8] = {'G', 'R', 'V', 'D', 'E', 'L', 'T', 'A'};
constexpr std::uint32_t kVersion = 1, kSliceVersion = 2;

template <class T>
void put(std::uint8_t*& p, T v) {
  std::memcpy(p, &v, sizeof v);  // little-endian hosts (as the state format)
  p += sizeof v;
}
template <class T>
T get(const std::uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}

std::size_t value_bytes(WireCodec c) {
  return c == WireCodec::fp32 ? 4 : 2;
}

// optim::by_fragments over [0, n), its fragments also cut at a and b (so that each lies wholly
// inside [a, b) or outside it).
void by_fragments_cut(std::size_t n, std::size_t a, std::size_t b,
                      const std::function<void(std::size_t, std::size_t)>& fn,
                      std::initializer_list<const optim::Floats*> arrays) {
  optim::by_fragments(0, std::min(a, n), fn, arrays);
  optim::by_fragments(std::min(a, n), std::min(b, n), fn, arrays);
  optim::by_fragments(std::min(b, n), n, fn, arrays);
}
}  // namespace

WireCodec delta_codec(WireCodec c) {
  return c == WireCodec::fp16 || c == WireCodec::bf16 ? c : WireCodec::fp32;
}

std::uint64_t delta_size(WireCodec c, std::uint64_t values, std::optional<std::uint64_t> count) {
  const std::uint64_t vb = value_bytes(delta_codec(c));
  if (!count || *count == values) return kDeltaHeaderBytes + vb * values;
  return kSliceDeltaHeaderBytes + vb * *count;
}

transport::Result<DeltaWriter> DeltaWriter::create(BlobStore& store, WireCodec codec,
                                                   std::uint64_t values, Slice slice) {
  codec = delta_codec(codec);
  const std::uint64_t lo = slice.lo, hi = slice.end(values);
  if (lo > hi || hi > values) return {errc::rejected, "a delta's slice past φ"};
  auto w = store.create(delta_size(codec, values, hi - lo));
  if (!w) return w.failure();
  return DeltaWriter(std::move(*w), codec, values, lo, hi - lo);
}

transport::Result<void> DeltaWriter::write(std::uint64_t offset, std::span<const float> v) {
  if (offset > count_ || v.size() > count_ - offset) return {errc::rejected, "past the delta"};
  const std::size_t vb = value_bytes(codec_);
  bytes_.resize(v.size() * vb);
  check_.resize(v.size());
  if (encode_values(codec_, v, bytes_) != optim::CodecError::ok ||
      decode_values(codec_, bytes_, check_) != optim::CodecError::ok ||
      (!v.empty() && std::memcmp(check_.data(), v.data(), v.size_bytes()) != 0))
    return {errc::rejected, std::string("values not exact in ") + to_string(codec_)};
  return w_->write(header_bytes() + offset * vb, bytes_);
}

transport::Result<std::shared_ptr<const StateBlob>> DeltaWriter::seal(std::uint64_t round,
                                                                      const Digest& from,
                                                                      const Digest& to) {
  std::uint8_t h[kSliceDeltaHeaderBytes] = {};
  std::uint8_t* p = h;
  std::memcpy(p, kMagic, sizeof kMagic);
  p += sizeof kMagic;
  const bool sliced = header_bytes() == kSliceDeltaHeaderBytes;
  put(p, sliced ? kSliceVersion : kVersion);
  put(p, static_cast<std::uint8_t>(codec_));
  p += 3;
  put(p, round);
  put(p, values_);
  std::memcpy(p, from.data(), from.size());
  std::memcpy(p + 32, to.data(), to.size());
  p += 64;
  if (sliced) {
    put(p, lo_);
    put(p, count_);
  }
  if (auto r = w_->write(0, std::span<const std::uint8_t>(h, header_bytes())); !r)
    return r.failure();
  return w_->seal();
}

transport::Result<DeltaHeader> read_delta_header(const StateBlob& blob) {
  if (blob.size() < kDeltaHeaderBytes) return {errc::rejected, "a delta shorter than its header"};
  std::uint8_t h[kSliceDeltaHeaderBytes] = {};
  if (auto r = blob.read(0, std::span(h).first(kDeltaHeaderBytes)); !r) return r.failure();
  const std::uint8_t* p = h;
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0) return {errc::rejected, "not a state delta"};
  p += sizeof kMagic;
  const auto version = get<std::uint32_t>(p);
  if (version != kVersion && version != kSliceVersion)
    return {errc::rejected, "delta version unknown"};
  DeltaHeader d;
  const auto c = get<std::uint8_t>(p);
  if (c != static_cast<std::uint8_t>(WireCodec::fp32) &&
      c != static_cast<std::uint8_t>(WireCodec::fp16) &&
      c != static_cast<std::uint8_t>(WireCodec::bf16))
    return {errc::rejected, "delta codec unknown"};
  d.codec = static_cast<WireCodec>(c);
  p += 3;
  d.round = get<std::uint64_t>(p);
  d.values = get<std::uint64_t>(p);
  std::memcpy(d.from.data(), p, 32);
  std::memcpy(d.to.data(), p + 32, 32);
  p += 64;
  d.count = d.values;
  if (version == kSliceVersion) {
    if (blob.size() < kSliceDeltaHeaderBytes)
      return {errc::rejected, "a delta shorter than its header"};
    if (auto r = blob.read(kDeltaHeaderBytes, std::span(h).subspan(kDeltaHeaderBytes)); !r)
      return r.failure();
    d.lo = get<std::uint64_t>(p);
    d.count = get<std::uint64_t>(p);
    d.header_bytes = kSliceDeltaHeaderBytes;
    if (d.lo > d.values || d.count > d.values - d.lo)
      return {errc::rejected, "the delta's slice is past its values"};
  }
  const std::size_t vb = value_bytes(d.codec);
  if (d.count > (blob.size() - d.header_bytes) / vb || d.header_bytes + d.count * vb != blob.size())
    return {errc::rejected, "delta size does not match its values"};
  return d;
}

transport::Result<void> replay_delta(const StateBlob& blob, optim::OuterState& s, Digest& hash,
                                     const optim::DiLoCoConfig& cfg, unsigned threads) {
  auto h = read_delta_header(blob);
  if (!h) return h.failure();
  if (h->values != s.phi.size() || s.momentum.size() != s.phi.size())
    return {errc::rejected, "the delta has " + std::to_string(h->values) + " values, φ " +
                                std::to_string(s.phi.size())};
  if (h->round != s.round + 1)
    return {errc::rejected, "the delta leads to round " + std::to_string(h->round) +
                                ", the state is at round " + std::to_string(s.round)};
  if (h->from != hash) return {errc::rejected, "the delta starts from other slow weights"};
  const optim::DiLoCoConfig step = cfg.at_round(h->round);  // (its outer warm-up's step)
  // The values it steps: φ[a, b) (all of φ but for a streaming fragment's round); the hash
  // covers all of φ.
  const std::size_t vb = value_bytes(h->codec), n = s.phi.size(), f = std::min(n, optim::kFragment);
  const std::size_t a = h->lo, b = h->lo + h->count;
  std::vector<std::uint8_t> bytes(f * vb);
  std::vector<float> d(f), phi(f), m(f);
  // Reads and decodes fragment [lo, hi) of φ's steps (within [a, b)) into d.
  const auto decode = [&](std::size_t lo, std::size_t hi) -> transport::Result<void> {
    const auto in = std::span(bytes).first((hi - lo) * vb);
    if (auto r = blob.read(h->header_bytes + (lo - a) * vb, in); !r)
      return {errc::rejected, "cannot read the delta: " + r.text()};
    if (decode_values(h->codec, in, std::span(d).first(hi - lo)) != optim::CodecError::ok)
      return {errc::rejected, "the delta holds values that do not decode (or are not finite)"};
    return {};
  };
  // First pass, the state untouched: each fragment stepped in a copy, which must stay finite
  // and hash, in the end, to the delta's `to`. A forged delta is refused here with the state as
  // it was. (Twice the step's arithmetic, no model-sized copy.)
  transport::Result<void> failed;
  transport::Blake2b256 to;
  by_fragments_cut(
      n, a, b,
      [&](std::size_t lo, std::size_t hi) {
        if (!failed) return;
        const auto len = hi - lo;
        if (lo >= b || hi <= a) {  // (fragments are cut at a and b) not stepped: hashed as is
          to.update(
              {reinterpret_cast<const std::uint8_t*>(s.phi.data() + lo), len * sizeof(float)});
          return;
        }
        if (failed = decode(lo, hi); !failed) return;
        std::copy_n(s.phi.data() + lo, len, phi.data());
        std::copy_n(s.momentum.data() + lo, len, m.data());
        optim::diloco_step(std::span(phi).first(len), std::span(m).first(len),
                           std::span(d).first(len), step, threads);
        if (!optim::all_finite(std::span<const float>(phi).first(len)) ||
            !optim::all_finite(std::span<const float>(m).first(len))) {
          failed = {errc::rejected, "the delta steps the slow weights past the float range"};
          return;
        }
        to.update({reinterpret_cast<const std::uint8_t*>(phi.data()), len * sizeof(float)});
      },
      {&s.phi, &s.momentum});
  if (!failed) return failed;
  if (to.final() != h->to) return {errc::rejected, "the replayed slow weights are not the delta's"};
  // Second pass: the same steps, in place (bit for bit what the first pass hashed). Only a read
  // that fails now leaves the state changed part way.
  bool touched = false;
  optim::by_fragments(a, b,
                      [&](std::size_t lo, std::size_t hi) {
                        if (!failed) return;
                        if (failed = decode(lo, hi); !failed) return;
                        touched = true;
                        const auto len = hi - lo;
                        optim::diloco_step(std::span(s.phi.data() + lo, len),
                                           std::span(s.momentum.data() + lo, len),
                                           std::span(d).first(len), step, threads);
                      },
                      {&s.phi, &s.momentum});
  if (!failed) {
    if (!touched) return failed;
    hash = weights_hash(s.phi);
    return {errc::source_failed, failed.text() + " (the state was changed part way)"};
  }
  s.round = h->round;
  hash = h->to;
  return {};
}

}  // namespace grove::gossip

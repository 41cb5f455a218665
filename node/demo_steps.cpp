#include "node/demo_steps.hpp"

#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "gossip/step_work.hpp"
#include "transport/error.hpp"

namespace grove::node {

namespace {
optim::DemoParams params_of(const RunConfig& c) {
  optim::DemoParams p;
  p.decay = c.demo_decay;
  p.topk = c.demo_topk;
  p.chunk = c.demo_chunk;
  p.weight_decay = 0;  // (the reference's runs: DeMo's own decay 0; AdamW's is not DeMo's)
  return p;
}
}  // namespace

DemoSteps::DemoSteps(Workload& w, const RunConfig& c, Collectives& calls)
    : w_(w), c_(c), calls_(calls) {
  const auto params = params_of(c);
  if (const char* why = optim::demo_params_problem(params); why && *why)
    throw transport::ConfigError(std::string("demo: ") + why);
  std::size_t at = 0;
  for (const auto& shape : w.shapes()) {
    const auto b = optim::demo_blocks(shape, params);
    offset_.push_back(at);
    msg_offset_.push_back(msg_values_);
    blocks_.push_back(b);
    at += b.size();
    msg_values_ += b.count() * 2 * b.k;
  }
  if (at != w.num_params())
    throw transport::ConfigError("demo: the workload's tensor shapes hold " + std::to_string(at) +
                                 " values, its θ " + std::to_string(w.num_params()));
  theta_.resize(at);
  grad_.resize(at);
  delta_.assign(at, 0.0f);
  spdlog::info(
      "demo: {} tensors, {} values a message ({:.1f} KB, {:.4f} of θ's bytes)", blocks_.size(),
      msg_values_, 4.0 * static_cast<double>(msg_values_) / 1e3,
      static_cast<double>(msg_values_) / static_cast<double>(std::max<std::size_t>(at, 1)));
}

bool DemoSteps::to_bytes(const optim::DemoBlocks& b, std::span<const float> in,
                         std::span<std::uint8_t> out) {
  const std::size_t k = b.k;
  for (std::size_t blk = 0; blk < b.count(); ++blk) {
    const float* src = in.data() + blk * 2 * k;
    std::uint8_t* dst = out.data() + blk * 6 * k;
    for (std::size_t i = 0; i < k; ++i) {
      const float v = src[i];
      if (!(v >= 0.0f && v < 65536.0f) || v != std::floor(v)) return false;
      const auto idx = static_cast<std::uint16_t>(v);
      dst[2 * i] = static_cast<std::uint8_t>(idx & 0xff);
      dst[2 * i + 1] = static_cast<std::uint8_t>(idx >> 8);
    }
    for (std::size_t i = 0; i < k; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &src[k + i], 4);
      for (int j = 0; j < 4; ++j)
        dst[2 * k + 4 * i + static_cast<std::size_t>(j)] =
            static_cast<std::uint8_t>(bits >> (8 * j));
    }
  }
  return true;
}

void DemoSteps::to_floats(const optim::DemoBlocks& b, std::span<const std::uint8_t> in,
                          std::span<float> out) {
  const std::size_t k = b.k;
  for (std::size_t blk = 0; blk < b.count(); ++blk) {
    const std::uint8_t* src = in.data() + blk * 6 * k;
    float* dst = out.data() + blk * 2 * k;
    for (std::size_t i = 0; i < k; ++i)
      dst[i] = static_cast<float>(src[2 * i] | (src[2 * i + 1] << 8));
    for (std::size_t i = 0; i < k; ++i) {
      std::uint32_t bits = 0;
      for (int j = 0; j < 4; ++j)
        bits |= std::uint32_t{src[2 * k + 4 * i + static_cast<std::size_t>(j)]} << (8 * j);
      std::memcpy(&dst[k + i], &bits, 4);
    }
  }
}

// A joiner came into the group: every member takes the θ of the first member (by rank) that has
// stepped, exactly (all of those hold the same bits); nobody has: the run's initial θ stays.
bool DemoSteps::align(const std::function<bool()>& stopping, DemoStep& out) {
  const std::size_t P = theta_.size();
  std::vector<float> in(P + 1, 0.0f);
  w_.get_params(std::span<float>(in).first(P));
  in[P] = stepped_ ? 1.0f : 0.0f;
  gossip::CallSpec spec;
  spec.kind = gossip::CallSpec::Kind::all_gather;
  spec.wire = WireCodec::fp32;
  auto r =
      calls_.run(spec, optim::Floats(std::move(in)), {}, std::chrono::milliseconds(0), stopping);
  if (!r.ok) {
    out.problem = "aligning θ with a joiner failed: " + r.why;
    return false;
  }
  out.bytes_sent += (r.size - 1) * (P + 1) * 4;
  out.bytes_received += (r.size - 1) * (P + 1) * 4;
  for (std::uint32_t m = 0; m < r.size; ++m) {
    const float* part = r.values.data() + m * (P + 1);
    if (part[P] != 1.0f) continue;
    if (m != r.rank) {
      std::copy(part, part + P, theta_.begin());
      w_.set_params(theta_);
    }
    out.aligned = true;
    return true;
  }
  return true;
}

DemoStep DemoSteps::step(std::uint64_t step, const std::function<bool()>& stopping) {
  DemoStep out;
  w_.gradient(step, grad_, out.step);
  const auto lr = static_cast<float>(inner_lr(c_, step));
  // Our message, tensor by tensor (δ loses what it sends).
  std::vector<float> mine(msg_values_);
  for (std::size_t t = 0; t < blocks_.size(); ++t) {
    const auto& b = blocks_[t];
    bytes_.resize(optim::demo_encoded_size(b));
    const auto e = demo_.compress(b, std::span<float>(delta_).subspan(offset_[t], b.size()),
                                  std::span<const float>(grad_).subspan(offset_[t], b.size()), lr,
                                  c_.demo_decay, bytes_);
    if (e != optim::CodecError::ok) {
      // A non-finite gradient: nothing of it reaches δ; this step sends nothing for the tensor.
      std::fill_n(mine.data() + msg_offset_[t], b.count() * 2 * b.k, 0.0f);
      out.problem = std::string("our gradient or momentum: ") + optim::to_string(e);
      continue;
    }
    to_floats(b, bytes_, std::span<float>(mine).subspan(msg_offset_[t], b.count() * 2 * b.k));
  }
  gossip::CallSpec spec;
  spec.kind = gossip::CallSpec::Kind::all_gather;
  spec.wire = WireCodec::fp32;
  auto r = calls_.run(spec, optim::Floats(mine), {}, std::chrono::milliseconds(0), stopping);
  std::size_t members = 1;
  const float* all = mine.data();
  if (r.ok) {
    members = r.size;
    all = r.values.data();
    out.bytes_sent = (members - 1) * msg_values_ * 4;  // a ring all-gather: every other's part
    out.bytes_received = out.bytes_sent;
    if (r.joined && members > 1) {
      // (our own message stays as it is: θ moves to the group's, then the step applies)
      if (!align(stopping, out)) {
        spdlog::warn("demo: {}", out.problem);
        members = 1;
        all = mine.data();
      }
    }
  } else {
    out.problem = "the step's exchange failed (" + r.why + "): our own step alone";
  }
  // The group's step size: the schedule at the call's number, which every member of the call
  // shares (a joiner's own step count does not).
  const auto group_lr = r.ok ? static_cast<float>(inner_lr(c_, r.call)) : lr;
  w_.get_params(theta_);
  // Each tensor: the members' messages, in the group's order, those that decode.
  members_.resize(members);
  std::vector<std::span<const std::uint8_t>> spans;
  for (std::size_t t = 0; t < blocks_.size(); ++t) {
    const auto& b = blocks_[t];
    const std::size_t n = b.count() * 2 * b.k;
    spans.clear();
    for (std::size_t m = 0; m < members; ++m) {
      auto& buf = members_[m];
      buf.resize(optim::demo_encoded_size(b));
      const auto part = std::span<const float>(all + m * msg_values_ + msg_offset_[t], n);
      if (!to_bytes(b, part, buf) || optim::demo_check(b, buf) != optim::CodecError::ok) {
        if (out.problem.empty())
          out.problem = "a member's message (rank " + std::to_string(m) + ") is malformed";
        continue;
      }
      spans.push_back(buf);
    }
    if (spans.empty()) continue;
    demo_.apply(b, spans, std::span<float>(theta_).subspan(offset_[t], b.size()), group_lr, 0.0f);
  }
  w_.set_params(theta_);
  stepped_ = true;
  out.members = static_cast<std::uint32_t>(members);
  // Every member of a call holds the same θ after it: a hash now and then shows it.
  if (r.ok && r.call % 1000 == 0)
    spdlog::info("demo: call {}: θ {} ({} members)", r.call,
                 transport::to_hex(gossip::weights_hash(theta_)).substr(0, 16), members);
  return out;
}

}  // namespace grove::node

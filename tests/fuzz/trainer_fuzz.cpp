// Fuzz target for the trainer link's messages (node/trainer_protocol.hpp): what a training
// process on the node's machine sends over its Unix socket (hello with the model's spec, step,
// stored, saved, collective, buffer).
//
// Properties checked on every input (a violation traps, so libFuzzer records a crash):
//   - decode_trainer_message never crashes; a rejection says why;
//   - an accepted hello is within its limits: 1 to kMaxTensors tensors, names of 1 to
//     kMaxTensorName bytes, at most kMaxTensorDims dimensions, a float dtype, at most
//     kMaxModelParams parameters in all; its numbers are finite;
//   - an accepted collective or buffer request is within its bounds (values, rank, group size,
//     timeout, wire codec);
//   - encoding a decoded message and decoding that gives the same message, and the spec's hash is
//     stable; a run made from an accepted hello passes its config check and accepts that hello.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "node/trainer_protocol.hpp"

namespace {
using namespace grove::node;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool same_number(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto m = decode_trainer_message(std::span<const std::uint8_t>(data, size));
  const std::string why = m.why();
  if (!m) {
    check(!why.empty());
    return 0;
  }
  auto again = decode_trainer_message(encode_trainer_message(*m));
  check(again.has_value() && again->index() == m->index());
  if (const auto* s = std::get_if<TrainerStep>(&*m)) {
    const auto& t = std::get<TrainerStep>(*again);
    check(same_number(s->loss, t.loss) && same_number(s->eval_loss, t.eval_loss) &&
          s->tokens == t.tokens);
    return 0;
  }
  if (const auto* c = std::get_if<TrainerCollective>(&*m)) {
    check(*c == std::get<TrainerCollective>(*again));
    check(c->n <= kMaxModelParams && c->peer < kMaxGroup && c->min_size <= kMaxGroup);
    check(c->timeout_s >= 0 && c->timeout_s <= 86400);
    check(c->wire == WireCodec::fp32 || c->wire == WireCodec::fp16);
    return 0;
  }
  if (const auto* b = std::get_if<TrainerBuffer>(&*m)) {
    check(*b == std::get<TrainerBuffer>(*again) && b->bytes <= 4 * kMaxModelParams * kMaxGroup);
    return 0;
  }
  const auto* h = std::get_if<TrainerHello>(&*m);
  if (!h) return 0;
  check(*h == std::get<TrainerHello>(*again));
  const auto& ts = h->model.tensors;
  check(!ts.empty() && ts.size() <= kMaxTensors);
  for (const auto& t : ts)
    check(!t.name.empty() && t.name.size() <= kMaxTensorName && t.shape.size() <= kMaxTensorDims);
  const auto params = h->model.params();
  check(params >= 1 && params <= kMaxModelParams);
  check(h->model.hash_hex() == std::get<TrainerHello>(*again).model.hash_hex());
  for (const auto& f : {h->outer_lr, h->outer_momentum, h->noloco_alpha, h->noloco_beta,
                        h->noloco_gamma, h->noloco_lookahead})
    check(!f || std::isfinite(*f));
  check(!h->noloco_group || (*h->noloco_group >= 2 && *h->noloco_group <= 64));
  check(!h->outer_warmup || *h->outer_warmup <= 1'000'000);
  check(!h->noloco_nesterov || *h->noloco_nesterov <= 1);
  check(!h->noloco_warmup || *h->noloco_warmup <= 1'000'000);
  if (h->version == kTrainerProtocol) {
    RunConfig c;
    apply_hello(*h, c);
    // The algorithm's numbers may be out of range for a run (config.check says so); when they
    // are not, the run accepts the trainer that made it.
    if (c.check().empty()) check(check_hello(*h, c).empty());
  }
  return 0;
}

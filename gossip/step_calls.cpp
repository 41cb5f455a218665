// StepCalls (step_calls.hpp): a node's per-step collective calls over its StepGroup.
#include "gossip/step_calls.hpp"

#include <algorithm>
#include <cstring>

#include "gossip/allgather.hpp"
#include "gossip/allreduce.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

StepCalls::StepCalls(std::string run, OpId group_op, NodeId self, StepCallsOptions opts)
    : run_(std::move(run)),
      self_(self),
      opts_(std::move(opts)),
      group_(group_op, self, opts_.group),
      last_members_{self} {}

OpId StepCalls::call_op(const std::string& run, std::uint64_t call,
                        const std::vector<NodeId>& members, const CallSpec& spec, std::uint64_t n) {
  transport::Blake2b256 h;
  const std::string tag = "grove/call";
  h.update(std::span(reinterpret_cast<const std::uint8_t*>(tag.data()), tag.size()));
  h.update(std::span(reinterpret_cast<const std::uint8_t*>(run.data()), run.size()));
  std::uint8_t c[8];
  for (int i = 0; i < 8; ++i) c[i] = static_cast<std::uint8_t>(call >> (8 * i));
  h.update(c);
  for (const auto& m : members) h.update(m);
  // What the call is: members whose calls differ (a joiner's loop out of step with the group's)
  // never mix their data; each finishes without the others.
  std::uint8_t what[11] = {static_cast<std::uint8_t>(spec.kind),
                           spec.mean ? std::uint8_t{1} : std::uint8_t{0},
                           static_cast<std::uint8_t>(spec.wire)};
  for (int i = 0; i < 8; ++i) what[3 + i] = static_cast<std::uint8_t>(n >> (8 * i));
  h.update(what);
  const auto d = h.final();
  OpId op{};
  std::memcpy(op.data(), d.data(), op.size());
  return op;
}

void StepCalls::submit(CallSpec spec, optim::Floats input, Time deadline, Time now,
                       optim::FloatAllocator out) {
  if (state_ != State::idle) {
    result_ = CallResult{};
    result_->why = "a collective is already in progress";
    return;
  }
  spec_ = spec;
  input_ = std::move(input);
  out_ = std::move(out);
  n_ = input_.size();
  deadline_ = deadline;
  state_ = State::waiting;
  result_.reset();
  try_begin(now);
}

void StepCalls::try_begin(Time now) {
  if (now >= deadline_) {
    // (A call that began holds the group until its operation ends: only a waiting one is here.)
    return finish(false, "no group formed for the call before its deadline", now);
  }
  auto cv = group_.begin(now);
  if (!cv) {
    if (!group_.failed_begin().empty()) finish(false, group_.failed_begin(), now);
    return;
  }
  view_ = *cv;
  const OpId op = call_op(run_, cv->call, cv->members, spec_, n_);
  RingTimers t = opts_.timers;
  t.total_timeout = std::max(Time(1), deadline_ - now);
  transport::Result<std::unique_ptr<Protocol>> made{transport::errc::rejected, "no operation"};
  if (spec_.kind == CallSpec::Kind::all_gather) {
    AllGatherOptions o;
    o.codec.kind = WireCodec::fp32;  // exact, as Grove's
    o.piece_values = opts_.chunk_values;
    o.timers = t;
    o.concat = true;
    o.alloc = out_ ? out_ : opts_.alloc;
    auto r = RingAllGather::create(op, self_, cv->members, std::move(input_), o, now);
    if (r)
      made = std::unique_ptr<Protocol>(std::move(*r));
    else
      made = {transport::errc::rejected, r.why()};
  } else {
    AllReduceOptions o;
    o.codec = spec_.kind == CallSpec::Kind::barrier ? WireCodec::fp32 : spec_.wire;
    o.mean = spec_.mean;
    o.chunk_values = opts_.chunk_values;
    o.heartbeat = t.heartbeat;
    o.chunk_timeout = t.chunk_timeout;
    o.start_grace = t.start_grace;
    o.linger = t.linger;
    o.total_timeout = t.total_timeout;
    o.alloc = opts_.alloc;
    const bool barrier = spec_.kind == CallSpec::Kind::barrier;
    optim::Floats in = barrier ? optim::Floats::zeros(1, {}) : std::move(input_);
    optim::Floats out =
        barrier ? optim::Floats{} : optim::Floats::zeros(n_, out_ ? out_ : opts_.alloc);
    auto r = RingAllReduce::create(op, self_, cv->members, std::move(in), o, now, std::move(out));
    if (r)
      made = std::unique_ptr<Protocol>(std::move(*r));
    else
      made = {transport::errc::rejected, r.why()};
  }
  if (!made) {
    group_.end(false, {}, now);
    return finish(false, made.why(), now);
  }
  op_ = std::move(*made);
  state_ = State::running;
}

std::unique_ptr<Protocol> StepCalls::take_op() {
  return std::move(op_);
}

void StepCalls::on_op_finished(std::unique_ptr<Protocol> p, Time now) {
  if (state_ != State::running || !p) return;
  auto* ring = dynamic_cast<RingOp*>(p.get());
  if (!ring || ring->status() != OpStatus::done) {
    group_.end(false, {}, now);
    return finish(false, ring ? ring->failure() : "the call's operation failed", now);
  }
  const auto members = ring->members();
  group_.end(true, members, now);
  const bool joined = std::any_of(members.begin(), members.end(), [&](const NodeId& m) {
    return std::find(last_members_.begin(), last_members_.end(), m) == last_members_.end();
  });
  last_members_ = members;
  last_call_ = view_.call;
  CallResult r;
  r.ok = true;
  r.joined = joined;
  r.call = view_.call;
  r.size = static_cast<std::uint32_t>(members.size());
  r.rank = static_cast<std::uint32_t>(std::find(members.begin(), members.end(), self_) -
                                      members.begin());
  if (spec_.kind == CallSpec::Kind::all_gather)
    r.values = static_cast<RingAllGather*>(ring)->take_result();
  else if (spec_.kind == CallSpec::Kind::all_reduce)
    r.values = static_cast<RingAllReduce*>(ring)->take_result();
  else if (members.size() < spec_.min_size && now < deadline_) {
    state_ = State::retry;  // a barrier waiting for the group to grow: another call soon
    retry_at_ = now + opts_.barrier_retry;
    return;
  }
  state_ = State::idle;
  out_ = {};
  result_ = std::move(r);
}

void StepCalls::on_message(const NodeId& from, const Message& m, Time now) {
  group_.on_message(from, m, now);
  if (state_ == State::waiting) try_begin(now);  // an admission, a welcome, an announcement
}

void StepCalls::on_peer_failed(const NodeId& peer, Time now) {
  group_.on_peer_failed(peer, now);
}

void StepCalls::on_timer(Time now) {
  if (auto d = group_.next_deadline(); d && *d <= now) group_.on_timer(now);
  if (state_ == State::waiting) return try_begin(now);
  if (state_ == State::retry && now >= retry_at_) {
    if (now >= deadline_)
      return finish(false,
                    "the group did not reach " + std::to_string(spec_.min_size) +
                        " members before the deadline",
                    now);
    state_ = State::waiting;
    try_begin(now);
  }
}

std::optional<Time> StepCalls::next_deadline() const {
  std::optional<Time> t = group_.next_deadline();
  const auto at = [&](Time x) { t = t ? std::min(*t, x) : x; };
  if (state_ == State::waiting) {
    at(deadline_);
    if (const auto w = group_.wake_at()) at(*w);
  }
  if (state_ == State::retry) at(retry_at_);
  return t;
}

void StepCalls::finish(bool ok, std::string why, Time now) {
  (void)now;
  state_ = State::idle;
  input_ = {};
  out_ = {};
  CallResult r;
  r.ok = ok;
  r.why = std::move(why);
  r.call = view_.call;
  result_ = std::move(r);
}

std::optional<CallResult> StepCalls::take_result() {
  return std::exchange(result_, std::nullopt);
}

}  // namespace grove::gossip

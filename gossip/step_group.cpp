// StepGroup (step_group.hpp): the views of a run's per-step collective calls.
#include "gossip/step_group.hpp"

#include <algorithm>

namespace grove::gossip {

namespace {

bool contains(const std::vector<NodeId>& sorted, const NodeId& id) {
  return std::binary_search(sorted.begin(), sorted.end(), id);
}

// A view from a peer: sorted, no repeats, within the size limit, and naming `self` and `from`.
bool valid_view(const std::vector<NodeId>& v, const NodeId& self, const NodeId& from,
                std::size_t max) {
  if (v.empty() || v.size() > max) return false;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (!(v[i - 1] < v[i])) return false;
  return contains(v, self) && contains(v, from);
}

}  // namespace

StepGroup::StepGroup(OpId op, NodeId self, StepGroupOptions opts)
    : op_(op), self_(self), opts_(opts), view_{self} {}

void StepGroup::set_candidates(std::vector<NodeId> ids, Time now) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::erase(ids, self_);
  const bool more = std::any_of(ids.begin(), ids.end(),
                                [&](const NodeId& id) { return !contains(candidates_, id); });
  // A smaller id not known before: it may admit us; it gets 2 × join_wait before we admit others.
  if (std::any_of(ids.begin(), ids.end(),
                  [&](const NodeId& id) { return id < self_ && !contains(candidates_, id); }))
    smaller_since_ = now;
  candidates_ = std::move(ids);
  if (more && alone()) next_ask_ = now;  // someone new to ask
}

void StepGroup::send(const NodeId& to, MsgKind kind, std::uint64_t call,
                     const std::vector<NodeId>& ids) {
  Header h;
  h.kind = kind;
  h.op = op_;
  h.count = call;
  h.view = ids;
  out_.push_back({to, encode_message(h, 0)});
}

void StepGroup::ask(Time now) {
  for (const auto& c : candidates_) send(c, MsgKind::join, 0, {});
  next_ask_ = now + opts_.join_retry;
}

void StepGroup::leave(Time now) {
  alone_since_ = now;
  view_ = {self_};
  view_final_ = true;
  announced_.clear();
  welcome_.reset();
  rejoin_ = true;
  next_ask_ = now;
}

void StepGroup::expire(Time now) {
  std::erase_if(pending_, [&](const auto& p) { return now >= p.second + opts_.join_ttl; });
}

bool StepGroup::admits(const NodeId& joiner, Time now) const {
  if (!alone()) return true;
  if (!(self_ < joiner)) return false;
  const bool smaller = !candidates_.empty() && candidates_.front() < self_;
  if (!smaller) return true;
  // (Counted from its first call or its last leaving, and from the last smaller id it learnt of.)
  return alone_since_ && now >= std::max(*alone_since_, smaller_since_) + 2 * opts_.join_wait;
}

std::vector<NodeId> StepGroup::proposal(Time now) const {
  std::vector<NodeId> v = view_;
  for (const auto& [id, at] : pending_) {
    if (v.size() >= opts_.max_members) break;
    if (!contains(view_, id) && admits(id, now)) v.push_back(id);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// The next call's view from the sequencer's announcement: its members that survived the last
// call, and its joiners.
void StepGroup::settle_view(const std::vector<NodeId>& announced) {
  std::vector<NodeId> v;
  for (const auto& id : announced)
    if (contains(survivors_, id) || !contains(prev_view_, id)) v.push_back(id);
  view_ = std::move(v);
  view_final_ = true;
  for (const auto& id : view_) pending_.erase(id);
}

std::optional<CallView> StepGroup::begin(Time now) {
  failed_begin_.clear();
  if (in_call_) return std::nullopt;
  if (!waiting_) {
    waiting_ = true;
    begun_ = now;
    if (!alone_since_) alone_since_ = now;
    join_until_ = now;
    if (alone() && rejoin_) {
      rejoin_ = false;
      if (!candidates_.empty()) {
        join_until_ = now + opts_.join_wait;
        ask(now);
      }
    }
  }
  if (alone() && welcome_) {
    call_ = welcome_->first;
    view_ = std::move(welcome_->second);
    view_final_ = true;
    welcome_.reset();
    std::erase_if(announced_, [&](const auto& a) { return a.first.first <= call_; });
    for (const auto& id : view_) pending_.erase(id);
  }
  if (alone() && now < join_until_) return std::nullopt;
  if (!view_final_) {
    const auto it = announced_.find({call_, prev_view_.front()});
    if (it != announced_.end()) {
      settle_view(it->second);
    } else if (now >= begun_ + opts_.announce_timeout) {
      waiting_ = false;
      failed_begin_ = "the group's sequencer did not announce call " + std::to_string(call_) +
                      " within " + std::to_string(opts_.announce_timeout.count() / 1000) +
                      " s; this node leaves the group and asks to join again";
      leave(now);
      return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  return start(now);
}

std::optional<CallView> StepGroup::start(Time now) {
  waiting_ = false;
  in_call_ = true;
  std::erase_if(announced_, [&](const auto& a) { return a.first.first <= call_; });
  if (sequencer() == self_) {
    auto next = proposal(now);
    for (const auto& m : view_)
      if (m != self_) send(m, MsgKind::announce, call_ + 1, next);
    announced_[{call_ + 1, self_}] = std::move(next);
  }
  CallView cv;
  cv.call = call_;
  cv.members = view_;
  cv.rank =
      static_cast<std::size_t>(std::lower_bound(view_.begin(), view_.end(), self_) - view_.begin());
  return cv;
}

void StepGroup::end(bool ok, std::vector<NodeId> survivors, Time now) {
  if (!in_call_) return;
  in_call_ = false;
  ++call_;
  if (!ok) {
    leave(now);
    return;
  }
  std::sort(survivors.begin(), survivors.end());
  survivors.erase(std::unique(survivors.begin(), survivors.end()), survivors.end());
  if (!contains(survivors, self_)) {
    survivors.push_back(self_);
    std::sort(survivors.begin(), survivors.end());
  }
  prev_view_ = view_;
  survivors_ = std::move(survivors);
  const NodeId seq = prev_view_.front();
  if (!contains(survivors_, seq)) {
    view_ = survivors_;  // the sequencer is gone: its announcement may have reached only some
    view_final_ = true;
    std::erase_if(announced_, [&](const auto& a) { return a.first.first <= call_; });
    return;
  }
  const auto it = announced_.find({call_, seq});
  if (it == announced_.end()) {
    view_final_ = false;  // begin() waits for it
    return;
  }
  settle_view(it->second);
  if (seq == self_)
    for (const auto& id : view_)
      if (!contains(prev_view_, id)) send(id, MsgKind::welcome, call_, view_);
}

void StepGroup::on_message(const NodeId& from, const Message& m, Time now) {
  if (from == self_) return;
  switch (m.h.kind) {
    case MsgKind::join:
      if (pending_.size() < opts_.max_members || pending_.contains(from)) pending_[from] = now;
      if (alone() && from < self_ && !contains(candidates_, from)) {
        // A smaller id alone: it admits us, not the other way round.
        candidates_.insert(std::lower_bound(candidates_.begin(), candidates_.end(), from), from);
        next_ask_ = now;
        smaller_since_ = now;
      }
      break;
    case MsgKind::announce: {
      // Kept for a call not begun yet (or a welcome's first calls); whether it came from the
      // sequencer of the call before is checked when it is used.
      const std::uint64_t lo = welcome_ ? welcome_->first : call_;
      if (m.h.count < lo || m.h.count > lo + 2) break;
      if (!valid_view(m.h.view, self_, from, opts_.max_members)) break;
      if (in_call_ && m.h.count <= call_) break;
      announced_[{m.h.count, from}] = m.h.view;
      while (announced_.size() > kMaxAnnounced) announced_.erase(std::prev(announced_.end()));
      break;
    }
    case MsgKind::welcome: {
      // Accepted while alone, unless this node is admitting someone itself at its next call.
      if (!alone() || !valid_view(m.h.view, self_, from, opts_.max_members)) break;
      const auto own = announced_.find({call_ + 1, self_});
      if (in_call_ && own != announced_.end() && own->second.size() > 1) break;
      if (!welcome_) welcome_.emplace(m.h.count, m.h.view);  // the first one wins
      break;
    }
    default:
      break;
  }
}

void StepGroup::on_peer_failed(const NodeId& peer, Time now) {
  (void)peer;
  (void)now;  // the calls' ring operations find failed members; views follow from them
}

void StepGroup::on_timer(Time now) {
  expire(now);
  if (alone() && !candidates_.empty() && now >= next_ask_ && !welcome_) ask(now);
}

std::optional<Time> StepGroup::next_deadline() const {
  std::optional<Time> t;
  const auto at = [&](Time x) { t = t ? std::min(*t, x) : x; };
  if (alone() && !candidates_.empty() && !welcome_) at(next_ask_);
  for (const auto& [id, asked] : pending_) at(asked + opts_.join_ttl);
  return t;
}

std::optional<Time> StepGroup::wake_at() const {
  if (!waiting_) return std::nullopt;
  if (alone()) return join_until_;
  return view_final_ ? std::nullopt : std::optional<Time>(begun_ + opts_.announce_timeout);
}

std::vector<Outgoing> StepGroup::take_outgoing() {
  return std::exchange(out_, {});
}

}  // namespace grove::gossip

#include "transport/faulty_link.hpp"

#include <algorithm>
#include <cmath>

#include <boost/asio/post.hpp>

namespace grove::transport {
namespace asio = boost::asio;

const FaultConfig& FaultPlan::config_for(const NodeId& peer) const {
  auto it = per_peer_.find(peer);
  return it == per_peer_.end() ? default_ : it->second;
}

void FaultPlan::disconnect(const NodeId& peer) {
  auto links = links_;  // cut() may prune the list
  for (auto& w : links)
    if (auto l = w.lock(); l && l->peer().id == peer) l->cut();
}

std::shared_ptr<FaultyLink> FaultyLink::wrap(std::shared_ptr<Link> inner,
                                             std::shared_ptr<FaultPlan> plan,
                                             asio::any_io_executor ex) {
  auto l = std::make_shared<FaultyLink>(std::move(inner), plan, std::move(ex));
  std::erase_if(plan->links_, [](auto& w) { return w.expired(); });
  plan->links_.push_back(l);
  return l;
}

FaultyLink::FaultyLink(std::shared_ptr<Link> inner, std::shared_ptr<FaultPlan> plan,
                       asio::any_io_executor ex)
    : inner_(std::move(inner)), plan_(std::move(plan)), timer_(std::move(ex)) {}

void FaultyLink::start(std::weak_ptr<LinkHandler> handler) {
  handler_ = std::move(handler);
  inner_->start(weak_from_this());
}

void FaultyLink::send(Frame f) {
  if (closed_) return;
  const FaultConfig& c = plan_->config_for(peer().id);
  if (c.fail_after_frames && sent_ >= c.fail_after_frames) {
    cut();
    return;
  }
  ++sent_;
  if (c.hang) {
    ++plan_->swallowed_;
    return;
  }
  if (c.loss > 0 && std::uniform_real_distribution<double>(0, 1)(plan_->rng_) < c.loss) {
    ++plan_->dropped_;
    return;
  }
  const auto now = Clock::now();
  // Serialised when the frames before it are and its own bytes have gone out at the rate;
  // delivered a latency (and jitter) later.
  busy_until_ = std::max(busy_until_, now);
  if (c.bandwidth_bytes_per_sec > 0)
    busy_until_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
        static_cast<double>(f.wire_size()) / c.bandwidth_bytes_per_sec));
  if (c.packet_loss > 0) {
    // Each lost packet of the frame costs a retransmission timeout (RFC 6298 with Linux's
    // 200 ms floor: at least 200 ms, plus the round trip), during which the sender sends
    // nothing new; the frames behind it wait (in-order delivery, below).
    const double packets = std::ceil(static_cast<double>(f.wire_size()) / 1448.0);
    std::binomial_distribution<std::uint64_t> lost(static_cast<std::uint64_t>(packets),
                                                   c.packet_loss);
    if (const auto n = lost(plan_->rng_); n > 0) {
      ++plan_->retransmitted_;
      busy_until_ += static_cast<Duration::rep>(n) * (Duration(200) + 2 * c.latency);
    }
  }
  auto at = busy_until_ + c.latency;
  if (c.jitter.count() > 0)
    at += Duration(std::uniform_int_distribution<long>(0, c.jitter.count())(plan_->rng_));
  at = std::max(at, last_at_);  // a link never reorders
  last_at_ = at;
  if (at <= now && delayed_.empty()) {
    inner_->send(std::move(f));
    return;
  }
  // Counted as queued until the timer sees it serialised (also when that is now: a frame of a
  // link without a rate leaves at the next turn), as a real link reports its queue when it can.
  queued_ += f.wire_size();
  delayed_.push_back({busy_until_, at, std::move(f)});
  arm();
}

std::size_t FaultyLink::queued_bytes() const {
  return inner_->queued_bytes() + queued_;
}

bool FaultyLink::serialise(Clock::time_point now) {
  bool moved = false;
  while (in_flight_ < delayed_.size() && delayed_[in_flight_].sent <= now) {
    queued_ -= delayed_[in_flight_].frame.wire_size();
    ++in_flight_;
    moved = true;
  }
  return moved;
}

// One timer for both events: the next frame to arrive and the next to leave the queue.
void FaultyLink::arm() {
  if (delayed_.empty()) return;
  auto next = delayed_.front().at;
  if (in_flight_ < delayed_.size()) next = std::min(next, delayed_[in_flight_].sent);
  if (timer_armed_ && timer_at_ <= next) return;
  timer_armed_ = true;
  timer_at_ = next;
  timer_.expires_at(next);  // cancels a later wait (its handler sees operation_aborted)
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec == boost::asio::error::operation_aborted) return;
    self->timer_armed_ = false;
    self->release();
  });
}

void FaultyLink::release() {
  if (closed_) return;
  const auto now = Clock::now();
  // Frames waiting to be serialised count in queued_bytes(): tell the session when some left,
  // or a sender that stopped at its limit would wait for its own timer.
  const bool drained = serialise(now);
  while (!delayed_.empty() && delayed_.front().at <= now) {
    inner_->send(std::move(delayed_.front().frame));
    delayed_.pop_front();
    --in_flight_;  // delivered frames were serialised first (sent <= at)
  }
  arm();
  if (drained)
    if (auto h = handler_.lock()) h->on_writable();
}

void FaultyLink::close(std::error_code reason, bool flush) {
  if (closed_) return;
  if (flush) {
    // Deliver what is still delayed first, then close (a flushed close keeps its promise).
    for (auto& d : delayed_) inner_->send(std::move(d.frame));
  }
  delayed_.clear();
  in_flight_ = queued_ = 0;
  closed_ = true;
  timer_.cancel();
  inner_->close(reason, flush);
}

void FaultyLink::cut() {
  if (closed_) return;
  closed_ = true;
  delayed_.clear();
  in_flight_ = queued_ = 0;
  timer_.cancel();
  inner_->close(make_error_code(errc::connection_truncated), false);
}

void FaultyLink::on_frame(Frame f) {
  if (plan_->config_for(peer().id).hang) {
    ++plan_->swallowed_;
    return;
  }
  if (auto h = handler_.lock()) h->on_frame(std::move(f));
}

void FaultyLink::on_writable() {
  if (auto h = handler_.lock()) h->on_writable();
}

void FaultyLink::on_closed(std::error_code ec) {
  closed_ = true;
  timer_.cancel();
  if (auto h = handler_.lock()) h->on_closed(ec);
  handler_.reset();
}

}  // namespace grove::transport

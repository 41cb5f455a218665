#include "transport/session.hpp"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

namespace grove::transport {
namespace asio = boost::asio;

namespace {
std::error_code code_from_wire(std::uint64_t v) {
  if (v > 0 && v <= static_cast<std::uint64_t>(errc::source_failed))
    return make_error_code(static_cast<errc>(v));
  return make_error_code(errc::remote_error);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Responder

Responder::Responder(std::weak_ptr<Session> s, asio::any_io_executor ex, std::uint64_t id,
                     Clock::time_point deadline, std::shared_ptr<std::atomic<bool>> cancelled)
    : s_(std::move(s)),
      ex_(std::move(ex)),
      id_(id),
      deadline_(deadline),
      cancelled_(std::move(cancelled)),
      done_(false) {}

Responder::Responder(Responder&& o) noexcept
    : s_(std::move(o.s_)),
      ex_(std::move(o.ex_)),
      id_(o.id_),
      deadline_(o.deadline_),
      cancelled_(std::move(o.cancelled_)),
      done_(o.done_) {
  o.done_ = true;
}

Responder::~Responder() {
  if (!done_) fail(errc::remote_error, "handler dropped the request without answering");
}

void Responder::reply(std::span<const std::uint8_t> body) {
  if (done_) return;
  send(encode_frame({FrameType::response, id_, 0, {}}, body));
}

void Responder::fail(errc code, const std::string& message) {
  if (done_) return;
  send(encode_frame({FrameType::response, id_, static_cast<std::uint64_t>(code), message}, {}));
}

void Responder::send(Frame f) {
  done_ = true;
  asio::post(ex_, [s = s_, id = id_, f = std::move(f)]() mutable {
    if (auto sp = s.lock()) sp->send_response(id, std::move(f));
  });
}

// ---------------------------------------------------------------------------------------------
// Chunk

Chunk::Chunk(Payload p, std::uint64_t offset, std::weak_ptr<Session> s, asio::any_io_executor ex,
             std::uint64_t stream_id)
    : p_(std::move(p)),
      offset_(offset),
      s_(std::move(s)),
      ex_(std::move(ex)),
      stream_id_(stream_id),
      live_(true) {}

Chunk::~Chunk() {
  if (!live_ || !ex_) return;
  // Moved-from chunks have an empty executor; only the last owner returns the credit.
  asio::post(ex_, [s = s_, id = stream_id_, n = p_.size()] {
    if (auto sp = s.lock()) sp->return_credit(id, n);
  });
}

// ---------------------------------------------------------------------------------------------
// DrainMeter

namespace detail {

DrainMeter::DrainMeter(double min_rate, double max_rate, Clock::duration window)
    : min_rate_(min_rate),
      max_rate_(std::max(min_rate, max_rate)),
      rate_(min_rate),
      window_(window) {}

void DrainMeter::measure(Clock::time_point now, std::uint64_t handed, std::uint64_t queued) {
  const std::uint64_t held = std::exchange(queued_at_, 0);  // (one look per interval)
  if (held == 0) return;  // the link held nothing: it may have sat idle
  // (A link's count may also grow without a send: FaultyLink hands a delayed frame to the link
  // below it, whose queue counts too. Never read that as bytes drained.)
  const std::uint64_t gone = handed - queued;
  const std::uint64_t drained = gone > drained_at_ ? gone - drained_at_ : 0;
  const double secs = std::chrono::duration<double>(now - at_).count();
  if (drained >= held) {
    // Everything that was queued left before we looked again, so the link drains at least
    // drained / interval. When data was held back, allow up to twice that (at most double the
    // estimate): a fast link gets up to speed in a few looks. A look that came late (the strand
    // was busy) shows a low bound and leaves the estimate alone; doubling on it would let a slow
    // link's queue grow to megabytes, with every control frame waiting behind them.
    if (held_back_ && secs > 0)
      rate_ =
          std::clamp(std::max(rate_, std::min(2 * rate_, 2 * static_cast<double>(drained) / secs)),
                     min_rate_, max_rate_);
    win_bytes_ = 0;
    win_time_ = {};
    return;
  }
  // The queue held data from the last look to this one: the link was busy all along (whether
  // or not the session had more to give it), and drained at this interval's rate.
  win_bytes_ += drained;
  win_time_ += now - at_;
  if (win_time_ < window_) return;
  rate_ =
      std::clamp(static_cast<double>(win_bytes_) / std::chrono::duration<double>(win_time_).count(),
                 min_rate_, max_rate_);
  win_bytes_ = 0;
  win_time_ = {};
}

void DrainMeter::mark(Clock::time_point now, std::uint64_t handed, std::uint64_t queued,
                      bool held_back) {
  held_back_ = held_back;
  at_ = now;
  drained_at_ = handed - queued;
  queued_at_ = queued;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Session

namespace {
double seconds(Duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

Session::Session(std::shared_ptr<Link> link, asio::any_io_executor strand, SessionOptions opts,
                 std::weak_ptr<SessionOwner> owner)
    : link_(std::move(link)),
      ex_(std::move(strand)),
      opts_(opts),
      owner_(std::move(owner)),
      tick_timer_(ex_),
      drain_timer_(ex_),
      // From the floor (a slow link must not get megabytes queued before it is measured); a
      // fast link doubles its way up within a few milliseconds.
      drain_(static_cast<double>(opts_.send_queue_floor) / seconds(opts_.send_queue_delay),
             static_cast<double>(opts_.send_high_water) / seconds(opts_.send_queue_delay)) {
  last_rx_ = last_activity_ = Clock::now();
}

Session::~Session() = default;

void Session::start() {
  link_->start(weak_from_this());
  arm_tick();
}

bool Session::busy() const {
  return !pending_.empty() || !incoming_.empty() || !out_.empty() || !in_.empty();
}

void Session::send_frame(Frame f) {
  stats_.bytes_sent += f.wire_size();
  link_->send(std::move(f));
}

std::uint64_t Session::request(const std::string& method, std::span<const std::uint8_t> body,
                               Duration timeout, ResponseHandler handler) {
  const std::uint64_t id = next_id_++;
  if (closed_ || closing_) {
    asio::post(ex_, [handler] { handler(errc::connection_closed); });
    return id;
  }
  if (pending_.size() >= opts_.max_outgoing_requests ||
      link_->queued_bytes() > opts_.max_send_queue) {
    asio::post(ex_, [handler] { handler(errc::limit_reached); });
    return id;
  }
  timeout = std::clamp(timeout, Duration(1), opts_.max_request_timeout);
  Pending p{std::move(handler), std::make_unique<asio::steady_timer>(ex_, timeout)};
  p.timer->async_wait([w = weak_from_this(), id](boost::system::error_code ec) {
    auto self = w.lock();
    if (ec || !self) return;
    auto it = self->pending_.find(id);
    if (it == self->pending_.end()) return;
    auto h = std::move(it->second.handler);
    self->pending_.erase(it);
    self->send_frame(encode_frame({FrameType::cancel, id, 0, {}}, {}));
    h(errc::timed_out);
  });
  pending_.emplace(id, std::move(p));
  ++stats_.requests_sent;
  last_activity_ = Clock::now();
  send_frame(encode_frame(
      {FrameType::request, id, static_cast<std::uint64_t>(timeout.count()), method}, body));
  return id;
}

void Session::cancel(std::uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  auto h = std::move(it->second.handler);
  it->second.timer->cancel();
  pending_.erase(it);
  if (!closed_) send_frame(encode_frame({FrameType::cancel, id, 0, {}}, {}));
  h(errc::cancelled);
}

std::error_code Session::send_message(const std::string& method,
                                      std::span<const std::uint8_t> body) {
  if (closed_ || closing_) return make_error_code(errc::connection_closed);
  if (link_->queued_bytes() > opts_.max_send_queue) return make_error_code(errc::limit_reached);
  last_activity_ = Clock::now();
  send_frame(encode_frame({FrameType::message, 0, 0, method}, body));
  return {};
}

std::uint64_t Session::send_stream(const std::string& kind, std::span<const std::uint8_t> meta,
                                   std::shared_ptr<StreamSource> source, StreamDone done) {
  const std::uint64_t id = next_id_++;
  if (closed_ || closing_) {
    asio::post(ex_, [done] { done(errc::connection_closed); });
    return id;
  }
  OutStream s{std::move(source), std::move(done)};
  s.total = s.source->size();
  s.progress = Clock::now();
  out_.emplace(id, std::move(s));
  ++stats_.streams_sent;
  last_activity_ = Clock::now();
  send_frame(encode_frame({FrameType::stream_open, id, out_.at(id).total, kind}, meta));
  return id;
}

void Session::reset_stream(std::uint64_t id, errc code, const std::string& reason) {
  if (!out_.count(id) && !in_.count(id)) return;
  if (!closed_)
    send_frame(
        encode_frame({FrameType::stream_reset, id, static_cast<std::uint64_t>(code), reason}, {}));
  if (out_.count(id)) finish_out(id, make_error_code(errc::cancelled));
  if (in_.count(id)) finish_in(id, make_error_code(errc::cancelled));
}

void Session::close(std::error_code reason) {
  if (closed_ || closing_) return;
  closing_ = true;
  send_frame(encode_frame({FrameType::goodbye, 0, static_cast<std::uint64_t>(reason.value()),
                           reason ? reason.message() : std::string()},
                          {}));
  link_->close(reason ? reason : make_error_code(errc::connection_closed), /*flush=*/true);
}

void Session::abort(std::error_code reason) {
  if (closed_) return;
  link_->close(reason, /*flush=*/false);
}

void Session::violation(const char* what) {
  spdlog::warn("transport: peer {} ({}) violated the protocol: {}; closing", short_id(peer().id),
               peer().address, what);
  abort(make_error_code(errc::protocol_violation));
}

// --- receiving ---------------------------------------------------------------------------------

void Session::on_frame(Frame f) {
  if (closed_) return;
  last_rx_ = Clock::now();
  stats_.bytes_received += f.wire_size();
  handle(std::move(f));
}

void Session::handle(Frame f) {
  auto d = decode_frame(f);
  if (!d) {
    spdlog::warn("transport: undecodable frame from peer {} ({}): {}; closing", short_id(peer().id),
                 peer().address, d.error().message());
    return abort(make_error_code(errc::malformed));
  }
  const FrameHeader& h = d->header;
  const std::size_t off = d->payload_offset, len = d->payload_size;
  switch (h.type) {
    case FrameType::request:
      return on_request_frame(h, Payload(std::move(f), off, len));
    case FrameType::response:
      return on_response_frame(h, Payload(std::move(f), off, len));
    case FrameType::message:
      last_activity_ = Clock::now();
      if (auto o = owner_.lock()) o->on_message(*this, h.text, Payload(std::move(f), off, len));
      return;
    case FrameType::cancel: {
      auto it = incoming_.find(h.id);
      if (it != incoming_.end()) {
        *it->second.cancelled = true;
        incoming_.erase(it);
      }
      return;
    }
    case FrameType::stream_open:
      return on_stream_open(h, Payload(std::move(f), off, len));
    case FrameType::stream_data:
      return on_stream_data(h, std::move(f), off, len);
    case FrameType::stream_credit:
      return on_stream_credit(h);
    case FrameType::stream_reset:
      return on_stream_end(h, false);
    case FrameType::stream_done:
      return on_stream_end(h, true);
    case FrameType::ping:
      return send_frame(encode_frame({FrameType::pong, h.id, 0, {}}, {}));
    case FrameType::pong:
      return;
    case FrameType::goodbye:
      goodbye_received_ = true;
      if (h.arg) spdlog::debug("transport: peer {} said goodbye: {}", short_id(peer().id), h.text);
      if (!closing_) {
        closing_ = true;
        link_->close(make_error_code(errc::connection_closed), /*flush=*/true);
      }
      return;
  }
}

void Session::on_request_frame(const FrameHeader& h, Payload body) {
  last_activity_ = Clock::now();
  ++stats_.requests_received;
  if (incoming_.count(h.id)) return violation("duplicate request id");
  const auto deadline = Clock::now() + std::min(Duration(h.arg), opts_.max_request_timeout);
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  Responder r(weak_from_this(), ex_, h.id, deadline, cancelled);
  if (incoming_.size() >= opts_.max_incoming_requests) {
    incoming_.emplace(h.id, Incoming{cancelled});
    r.fail(errc::limit_reached, "too many concurrent requests");
    return;
  }
  incoming_.emplace(h.id, Incoming{cancelled});
  if (closing_) {
    r.fail(errc::shutting_down, "closing");
    return;
  }
  if (auto o = owner_.lock()) o->on_request(*this, h.text, std::move(body), std::move(r));
}

void Session::send_response(std::uint64_t id, Frame f) {
  auto it = incoming_.find(id);
  if (it == incoming_.end() || closed_) return;  // cancelled, timed out, or gone
  incoming_.erase(it);
  last_activity_ = Clock::now();
  send_frame(std::move(f));
}

void Session::on_response_frame(const FrameHeader& h, Payload body) {
  last_activity_ = Clock::now();
  auto it = pending_.find(h.id);
  if (it == pending_.end()) return;  // late answer after timeout/cancel: ignore
  auto handler = std::move(it->second.handler);
  it->second.timer->cancel();
  pending_.erase(it);
  if (h.arg == 0) {
    handler(std::move(body));
  } else {
    if (!h.text.empty())
      spdlog::debug("transport: request {} to {} failed remotely: {}", h.id, short_id(peer().id),
                    h.text);
    handler(code_from_wire(h.arg));
  }
}

void Session::on_stream_open(const FrameHeader& h, Payload meta) {
  last_activity_ = Clock::now();
  auto refuse = [&](errc code, const char* why) {
    send_frame(
        encode_frame({FrameType::stream_reset, h.id, static_cast<std::uint64_t>(code), why}, {}));
  };
  if (in_.count(h.id)) return violation("duplicate stream id");
  if (in_.size() >= opts_.max_incoming_streams)
    return refuse(errc::limit_reached, "too many streams");
  if (h.arg > opts_.max_stream_size) return refuse(errc::rejected, "stream too large");
  IncomingStream is{h.text, h.arg, std::move(meta)};
  std::shared_ptr<StreamSink> sink;
  if (auto o = owner_.lock()) sink = o->on_stream(*this, is);
  if (!sink) return refuse(errc::rejected, "stream refused");
  ++stats_.streams_received;
  InStream s{std::move(sink), h.arg, 0, 0, Clock::now()};
  auto [it, _] = in_.emplace(h.id, std::move(s));
  if (it->second.total == 0) {
    send_frame(encode_frame({FrameType::stream_done, h.id, 0, {}}, {}));
    return finish_in(h.id, {});
  }
  grant(h.id, it->second);
}

void Session::grant(std::uint64_t id, InStream& s) {
  // The initial window; afterwards credit flows back as the sink releases chunks.
  const std::uint64_t add = std::min<std::uint64_t>(opts_.stream_window, s.total - s.granted);
  if (add == 0) return;
  s.granted += add;
  send_frame(encode_frame({FrameType::stream_credit, id, add, {}}, {}));
}

void Session::on_stream_data(const FrameHeader& h, Frame f, std::size_t off, std::size_t len) {
  last_activity_ = Clock::now();
  auto it = in_.find(h.id);
  if (it == in_.end()) return;  // stream we reset or refused: the sender will learn
  InStream& s = it->second;
  if (h.arg != s.received) return violation("stream data out of order");
  if (s.received + len > s.granted) return violation("stream data beyond granted credit");
  s.received += len;
  s.progress = Clock::now();
  auto sink = s.sink;
  const bool complete = s.received == s.total;
  sink->on_data(Chunk(Payload(std::move(f), off, len), h.arg, weak_from_this(), ex_, h.id));
  if (complete && in_.count(h.id)) {
    send_frame(encode_frame({FrameType::stream_done, h.id, 0, {}}, {}));
    finish_in(h.id, {});
  }
}

void Session::return_credit(std::uint64_t id, std::uint64_t bytes) {
  auto it = in_.find(id);
  if (it == in_.end() || closed_) return;
  InStream& s = it->second;
  const std::uint64_t add = std::min<std::uint64_t>(bytes, s.total - s.granted);
  if (add == 0) return;
  s.granted += add;
  send_frame(encode_frame({FrameType::stream_credit, id, add, {}}, {}));
}

void Session::on_stream_credit(const FrameHeader& h) {
  auto it = out_.find(h.id);
  if (it == out_.end()) return;
  OutStream& s = it->second;
  if (h.arg > s.total || s.credit + h.arg > s.total) return violation("credit beyond stream size");
  s.accepted = true;
  s.credit += h.arg;
  s.progress = Clock::now();
  pump();
}

void Session::on_stream_end(const FrameHeader& h, bool done) {
  last_activity_ = Clock::now();
  if (done) {
    auto it = out_.find(h.id);
    if (it == out_.end()) return;
    if (it->second.next != it->second.total)
      return violation("stream done before all data was sent");
    return finish_out(h.id, {});
  }
  const auto ec = code_from_wire(h.arg);
  if (!h.text.empty())
    spdlog::debug("transport: peer {} reset stream {}: {}", short_id(peer().id), h.id, h.text);
  if (out_.count(h.id)) finish_out(h.id, ec);
  if (in_.count(h.id)) finish_in(h.id, ec);
}

// --- sending stream data ---------------------------------------------------------------------

void Session::on_writable() {
  pump();
}

void Session::pump() {
  if (closed_) return;
  drain_.measure(Clock::now(), stats_.bytes_sent, link_->queued_bytes());
  const std::size_t limit = send_limit();
  // Smaller frames on slower links: a control frame queued behind one waits less.
  const std::size_t chunk =
      std::min(opts_.stream_chunk, std::max<std::size_t>(limit / 4, 16u << 10));
  bool held_back = false;
  for (auto& [id, s] : out_)  // oldest stream first
    if (!pump(id, s, limit, chunk)) {
      held_back = true;
      break;
    }
  drain_.mark(Clock::now(), stats_.bytes_sent, link_->queued_bytes(), held_back);
  if (held_back) arm_drain_timer(limit);
}

std::size_t Session::send_limit() const {
  const double bytes = drain_.rate() * seconds(opts_.send_queue_delay);
  return std::clamp(static_cast<std::size_t>(bytes), opts_.send_queue_floor, opts_.send_high_water);
}

// Returns false when the link's queue stopped it (data and credit were left).
bool Session::pump(std::uint64_t id, OutStream& s, std::size_t limit, std::size_t chunk) {
  while (!closed_ && s.accepted && s.next < s.total && s.credit > 0) {
    if (link_->queued_bytes() >= limit) return false;
    const std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>({chunk, s.total - s.next, s.credit}));
    const std::uint64_t off = s.next;
    s.next += n;
    s.credit -= n;
    s.progress = Clock::now();
    last_activity_ = Clock::now();
    std::span<std::uint8_t> payload;
    Frame f = encode_frame({FrameType::stream_data, id, off, {}}, n, &payload);
    stats_.bytes_sent += f.wire_size();
    // The link pulls the data from the source on its send worker right before sealing it
    // (off the host strand, and on the same core as the encryption). StreamSource's contract
    // (in order, one call at a time) holds because one link seals in FIFO order.
    Frame reset = encode_frame({FrameType::stream_reset, id,
                                static_cast<std::uint64_t>(errc::source_failed), "source failed"},
                               {});
    link_->send_filled(
        std::move(f), payload,
        [src = s.source, off, w = weak_from_this(), ex = ex_, id](std::span<std::uint8_t> out) {
          auto r = src->read(off, out);
          if (r) return true;
          spdlog::warn("transport: stream {} source failed at offset {}: {}", id, off,
                       r.error().message());
          asio::post(ex, [w, id] {
            if (auto self = w.lock()) self->finish_out(id, make_error_code(errc::source_failed));
          });
          return false;
        },
        std::move(reset));
  }
  return true;
}

// The link reports on_writable() only after its queue fell below its own low-water mark,
// which may lie above our limit; so when data was held back, look again once the queue should
// be half drained at the measured rate (a spare wake-up costs one pump()).
void Session::arm_drain_timer(std::size_t limit) {
  if (drain_armed_) return;
  const std::size_t queued = link_->queued_bytes();
  const double wait =
      static_cast<double>(queued > limit / 2 ? queued - limit / 2 : 0) / drain_.rate();
  const auto d = std::clamp<Clock::duration>(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)),
      std::chrono::milliseconds(1), std::chrono::milliseconds(100));
  drain_armed_ = true;
  drain_timer_.expires_after(d);
  drain_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (ec || !self) return;
    self->drain_armed_ = false;
    self->pump();
  });
}

void Session::finish_out(std::uint64_t id, std::error_code ec) {
  auto it = out_.find(id);
  if (it == out_.end()) return;
  auto done = std::move(it->second.done);
  out_.erase(it);
  if (done) done(ec);
}

void Session::finish_in(std::uint64_t id, std::error_code ec) {
  auto it = in_.find(id);
  if (it == in_.end()) return;
  auto sink = std::move(it->second.sink);
  in_.erase(it);
  sink->on_end(ec);
}

// --- timers and teardown ---------------------------------------------------------------------

void Session::arm_tick() {
  Duration period = std::min({opts_.keepalive, opts_.stream_timeout / 4, opts_.dead_after / 4});
  if (retiring_) period = std::min(period, retire_grace_ / 2);
  period = std::max(period, Duration(10));
  tick_period_ = period;
  tick_due_ = Clock::now() + period;
  tick_timer_.expires_after(period);
  tick_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (ec || !self || self->closed_) return;
    self->tick();
    if (!self->closed_) self->arm_tick();
  });
}

void Session::tick() {
  const auto now = Clock::now();
  // A tick that comes far later than it was due means this process did not run (a stall of the
  // machine: 20 s while three 500M nodes shared one): what the peer sent meanwhile waits unread
  // in the socket. That time is not the peer's silence, nor its streams' lack of progress.
  if (const auto late = now - tick_due_; late > 2 * tick_period_) {
    const auto slept = std::chrono::duration_cast<Duration>(late);
    spdlog::debug("transport: session with {} was not served for {} ms; its timers are moved on",
                  short_id(peer().id), slept.count());
    last_rx_ = std::min(now, last_rx_ + slept);
    for (auto& [id, s] : out_) s.progress = std::min(now, s.progress + slept);
    for (auto& [id, s] : in_) s.progress = std::min(now, s.progress + slept);
  }
  if (now - last_rx_ > opts_.dead_after) {
    spdlog::info("transport: peer {} ({}) silent for {} ms; closing", short_id(peer().id),
                 peer().address, opts_.dead_after.count());
    return abort(make_error_code(errc::timed_out));
  }
  if (now - last_rx_ >= opts_.keepalive && !closing_)
    send_frame(encode_frame({FrameType::ping, next_id_++, 0, {}}, {}));
  std::vector<std::uint64_t> stalled_out, stalled_in;
  for (auto& [id, s] : out_)
    if (now - s.progress > opts_.stream_timeout) stalled_out.push_back(id);
  // An incoming stream is stalled only while the sender has credit it does not use.
  for (auto& [id, s] : in_)
    if (s.granted > s.received && now - s.progress > opts_.stream_timeout) stalled_in.push_back(id);
  for (auto id : stalled_out) abandon(id, true);
  for (auto id : stalled_in) abandon(id, false);
  const Duration idle = retiring_ ? retire_grace_ : opts_.idle_timeout;
  if (!busy() && !closing_ && now - last_activity_ > idle) close();
}

void Session::retire(Duration grace) {
  retiring_ = true;
  retire_grace_ = grace;
  if (!closed_) arm_tick();  // re-arm at the shorter period (replaces the pending wait)
}

void Session::abandon(std::uint64_t id, bool outgoing) {
  spdlog::info("transport: stream {} {} {} made no progress for {} ms; abandoning", id,
               outgoing ? "to" : "from", short_id(peer().id), opts_.stream_timeout.count());
  send_frame(encode_frame(
      {FrameType::stream_reset, id, static_cast<std::uint64_t>(errc::timed_out), "stalled"}, {}));
  if (outgoing) {
    finish_out(id, make_error_code(errc::timed_out));
  } else {
    finish_in(id, make_error_code(errc::timed_out));
  }
}

void Session::on_closed(std::error_code ec) {
  if (closed_) return;
  if (ec == errc::connection_truncated && goodbye_received_)
    ec = make_error_code(errc::connection_closed);
  teardown(ec);
}

void Session::teardown(std::error_code ec) {
  closed_ = true;
  tick_timer_.cancel();
  drain_timer_.cancel();
  const auto fail_ec = ec ? ec : make_error_code(errc::connection_closed);
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending) {
    p.timer->cancel();
    p.handler(fail_ec);
  }
  for (auto& [id, inc] : incoming_) *inc.cancelled = true;
  incoming_.clear();
  auto outs = std::move(out_);
  out_.clear();
  for (auto& [id, s] : outs)
    if (s.done) s.done(fail_ec);
  auto ins = std::move(in_);
  in_.clear();
  for (auto& [id, s] : ins) s.sink->on_end(fail_ec);
  if (auto o = owner_.lock()) o->on_session_closed(*this, ec);
}

}  // namespace grove::transport

// Session: everything above a Link that every link type shares — request/response RPC with a
// deadline per request and cancellation, one-way messages, bulk streams with credit-based flow
// control, keepalive, dead-peer detection and idle close.
//
// Streams: the sender announces (stream_open: kind, total size, metadata); the receiver's
// acceptor returns a sink or refuses. The receiver grants credit in bytes (at most
// SessionOptions::stream_window outstanding) and returns it only when the sink has *released*
// a chunk (the Chunk object is destroyed), so a slow consumer slows the sender and the memory
// held per stream stays below the window. The sender queues data frames only as far as credit
// and the link's send queue allow; the link pulls each chunk from the StreamSource right before
// sealing it (TcpLink: on its send worker, off the host strand and on the same core as the
// encryption; in-memory links: inline). The receiver confirms the last byte with stream_done.
//
// Send priority: every other frame (requests, responses, messages, credit, stream_done, resets,
// pings) goes to the link at once, so the only thing it can wait behind is stream data already
// in the link's queue. That data is kept to about `send_queue_delay` of sending time at the
// rate the link is measured to drain (DrainMeter below), and data frames shrink on slow links,
// so a credit or a confirmation never waits behind megabytes of bulk data: on a shared link
// both peers' streams keep flowing instead of stalling on each other's control frames.
// Streams are served oldest first (they finish in the order they were opened).
//
// Threading: a Session lives on the host strand; its public methods must be called there.
// Responder, Chunk and Payload may be used and destroyed on any thread.
#pragma once

#include <atomic>
#include <map>
#include <unordered_map>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "transport/link.hpp"

namespace grove::transport {

class Session;

/// Received bytes: a view into the frame that carried them (no copy).
class Payload {
 public:
  Payload() = default;
  Payload(Frame f, std::size_t off, std::size_t len) : f_(std::move(f)), off_(off), len_(len) {}
  std::span<const std::uint8_t> bytes() const { return f_.buf.span().subspan(off_, len_); }
  std::size_t size() const noexcept { return len_; }

 private:
  Frame f_;
  std::size_t off_ = 0, len_ = 0;
};

using ResponseHandler = std::function<void(Result<Payload>)>;

/// Answers one incoming request, once, from any thread. Dropping it unanswered sends an
/// error response. reply()/fail() after the requester cancelled or the session closed do nothing.
class Responder {
 public:
  Responder(std::weak_ptr<Session> s, boost::asio::any_io_executor ex, std::uint64_t id,
            Clock::time_point deadline, std::shared_ptr<std::atomic<bool>> cancelled);
  Responder(Responder&&) noexcept;
  Responder& operator=(Responder&&) = delete;
  Responder(const Responder&) = delete;
  ~Responder();

  void reply(std::span<const std::uint8_t> body);
  /// An error response; the requester sees `code` (remote_error if it is not a transport code).
  void fail(errc code, const std::string& message);
  /// True once the requester cancelled or its deadline passed.
  bool cancelled() const { return (cancelled_ && *cancelled_) || Clock::now() > deadline_; }
  Clock::time_point deadline() const noexcept { return deadline_; }

 private:
  void send(Frame f);
  std::weak_ptr<Session> s_;
  boost::asio::any_io_executor ex_;
  std::uint64_t id_ = 0;
  Clock::time_point deadline_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
  bool done_ = true;
};

/// Produces a stream's bytes. read() is called on a worker thread, in offset order, one call
/// at a time per stream; it must fill `out` completely.
class StreamSource {
 public:
  virtual ~StreamSource() = default;
  virtual std::uint64_t size() const = 0;
  virtual Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) = 0;
};

/// One received piece of a stream. Holding it holds its share of the flow-control window;
/// destroying it (on any thread) lets the sender send that many more bytes.
class Chunk {
 public:
  Chunk(Payload p, std::uint64_t offset, std::weak_ptr<Session> s, boost::asio::any_io_executor ex,
        std::uint64_t stream_id);
  Chunk(Chunk&&) noexcept = default;
  Chunk& operator=(Chunk&&) noexcept = default;
  ~Chunk();
  std::uint64_t offset() const noexcept { return offset_; }
  std::span<const std::uint8_t> bytes() const { return p_.bytes(); }

 private:
  Payload p_;
  std::uint64_t offset_ = 0;
  std::weak_ptr<Session> s_;
  boost::asio::any_io_executor ex_;
  std::uint64_t stream_id_ = 0;
  bool live_ = false;
};

/// Consumes an incoming stream (host strand). on_data gets chunks in order; on_end comes once:
/// ok after every byte arrived, otherwise the reason (peer reset, timeout, connection lost).
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual void on_data(Chunk c) = 0;
  virtual void on_end(std::error_code ec) = 0;
};

struct IncomingStream {
  std::string kind;
  std::uint64_t size = 0;
  Payload meta;
};

using StreamDone = std::function<void(std::error_code)>;

/// Callbacks from a session to whoever owns it (the Host). Host strand.
class SessionOwner {
 public:
  virtual ~SessionOwner() = default;
  virtual void on_request(Session& s, const std::string& method, Payload body, Responder r) = 0;
  virtual void on_message(Session& s, const std::string& method, Payload body) = 0;
  /// Returns a sink to accept, nullptr to refuse (the sender gets errc::rejected).
  virtual std::shared_ptr<StreamSink> on_stream(Session& s, IncomingStream& in) = 0;
  virtual void on_session_closed(Session& s, std::error_code ec) = 0;
};

struct SessionOptions {
  Duration keepalive{5000};        ///< ping when nothing was received for this long
  Duration dead_after{20000};      ///< close when nothing was received for this long
  Duration idle_timeout{120000};   ///< close gracefully with no requests/streams for this long
  Duration stream_timeout{30000};  ///< a stream that makes no progress for this long fails
  Duration max_request_timeout{600000};
  std::size_t stream_window = 8u << 20;  ///< credit outstanding per incoming stream
  /// Payload bytes per stream_data frame at most (on slow links frames are smaller: a quarter
  /// of the current data-queue limit, so that one frame delays a control frame little).
  std::size_t stream_chunk = 1u << 20;
  /// Stream data is pulled only while the link holds less than about this much sending time at
  /// its measured drain rate, bounded below by send_queue_floor and above by send_high_water.
  Duration send_queue_delay{10};
  std::size_t send_queue_floor = 256u << 10;
  std::size_t send_high_water = 8u << 20;
  /// Refuse requests and messages (limit_reached) while more than this many bytes wait.
  std::size_t max_send_queue = 64u << 20;
  std::size_t max_incoming_streams = 16;
  std::size_t max_incoming_requests = 256;  ///< concurrently unanswered requests from the peer
  std::size_t max_outgoing_requests = 4096;
  std::uint64_t max_stream_size = 1ull << 40;
};

struct SessionStats {
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t requests_sent = 0, requests_received = 0;
  std::uint64_t streams_sent = 0, streams_received = 0;
};

namespace detail {

/// Measures how fast a link drains its send queue (bytes per second), for sizing how much
/// stream data may wait in it. Sans-IO: the session passes the time, the bytes it has handed
/// to the link so far and the bytes the link still holds. An interval from one look to the next
/// counts when the queue held data at both ends (the link was busy all along: an idle link
/// would look slow); averaged over at least `window` of them. When the queue ran dry during an
/// interval in which the session held data back, the link drains at least what left over that
/// interval: the estimate rises to twice that, at most doubling (a look that came late says
/// little, and must not grow the queue a control frame waits behind). It starts at `min_rate`
/// and stays within [min_rate, max_rate] (a stalled link reads as min_rate, not as zero, so
/// that it gets back to speed in a few doublings).
class DrainMeter {
 public:
  DrainMeter(double min_rate, double max_rate, Clock::duration window = Duration(20));
  /// Before adding data: closes the interval that started at the last mark().
  void measure(Clock::time_point now, std::uint64_t handed, std::uint64_t queued);
  /// After adding data: starts an interval; `held_back` = data and credit were left unsent
  /// because the queue was at its limit.
  void mark(Clock::time_point now, std::uint64_t handed, std::uint64_t queued, bool held_back);
  double rate() const noexcept { return rate_; }

 private:
  double min_rate_, max_rate_, rate_;
  Clock::duration window_;
  bool held_back_ = false;
  Clock::time_point at_{};
  std::uint64_t drained_at_ = 0, queued_at_ = 0;
  std::uint64_t win_bytes_ = 0;
  Clock::duration win_time_{};
};

}  // namespace detail

class Session final : public LinkHandler, public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Link> link, boost::asio::any_io_executor strand, SessionOptions opts,
          std::weak_ptr<SessionOwner> owner);
  ~Session() override;

  void start();
  const PeerInfo& peer() const { return link_->peer(); }
  bool closed() const noexcept { return closed_; }
  const SessionStats& stats() const noexcept { return stats_; }

  /// Sends a request; `handler` runs exactly once on the host strand (response, error,
  /// timed_out, cancelled or connection_closed). Returns the id for cancel().
  std::uint64_t request(const std::string& method, std::span<const std::uint8_t> body,
                        Duration timeout, ResponseHandler handler);
  /// Cancels a pending request: its handler gets errc::cancelled and the peer is told.
  void cancel(std::uint64_t request_id);
  /// Queues a one-way message; limit_reached if the peer is not draining its queue.
  std::error_code send_message(const std::string& method, std::span<const std::uint8_t> body);
  /// Streams `source` to the peer; `done` runs once: ok when the peer confirmed every byte.
  std::uint64_t send_stream(const std::string& kind, std::span<const std::uint8_t> meta,
                            std::shared_ptr<StreamSource> source, StreamDone done);
  /// Aborts an outgoing stream (done gets errc::cancelled) or an incoming one.
  void reset_stream(std::uint64_t stream_id, errc code, const std::string& reason);
  /// Graceful close: goodbye, flush, close. Pending operations fail with connection_closed.
  void close(std::error_code reason = {});
  /// Abrupt close (no goodbye).
  void abort(std::error_code reason);
  /// Marks a duplicate session (Host keeps another one to the same peer): it closes gracefully
  /// once it has had no requests or streams for `grace`, instead of idle_timeout.
  void retire(Duration grace);
  bool retiring() const noexcept { return retiring_; }
  bool busy() const;

  // LinkHandler
  void on_frame(Frame f) override;
  void on_writable() override;
  void on_closed(std::error_code ec) override;

  // Internal (used by Responder and Chunk through the strand).
  void send_response(std::uint64_t id, Frame f);
  void return_credit(std::uint64_t stream_id, std::uint64_t bytes);

 private:
  struct Pending {
    ResponseHandler handler;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  struct Incoming {
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  struct OutStream {
    std::shared_ptr<StreamSource> source;
    StreamDone done;
    std::uint64_t total = 0;
    std::uint64_t next = 0;    // next offset to pull
    std::uint64_t credit = 0;  // bytes we may still send
    bool accepted = false;
    Clock::time_point progress{};
  };
  struct InStream {
    std::shared_ptr<StreamSink> sink;
    std::uint64_t total = 0;
    std::uint64_t received = 0;
    std::uint64_t granted = 0;  // cumulative bytes the sender may have sent
    Clock::time_point progress{};
  };

  void send_frame(Frame f);
  void handle(Frame f);
  void on_request_frame(const FrameHeader& h, Payload body);
  void on_response_frame(const FrameHeader& h, Payload body);
  void on_stream_open(const FrameHeader& h, Payload meta);
  void on_stream_data(const FrameHeader& h, Frame f, std::size_t off, std::size_t len);
  void on_stream_credit(const FrameHeader& h);
  void on_stream_end(const FrameHeader& h, bool done);
  void pump();
  bool pump(std::uint64_t id, OutStream& s, std::size_t limit, std::size_t chunk);
  std::size_t send_limit() const;
  void arm_drain_timer(std::size_t limit);
  void finish_out(std::uint64_t id, std::error_code ec);
  void finish_in(std::uint64_t id, std::error_code ec);
  void grant(std::uint64_t id, InStream& s);
  void tick();
  void abandon(std::uint64_t id, bool outgoing);
  void arm_tick();
  void violation(const char* what);
  void teardown(std::error_code ec);

  std::shared_ptr<Link> link_;
  boost::asio::any_io_executor ex_;
  SessionOptions opts_;
  std::weak_ptr<SessionOwner> owner_;
  boost::asio::steady_timer tick_timer_;
  boost::asio::steady_timer drain_timer_;  // re-pumps when the link should have drained
  bool drain_armed_ = false;
  detail::DrainMeter drain_;
  SessionStats stats_;

  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::unordered_map<std::uint64_t, Incoming> incoming_;
  std::map<std::uint64_t, OutStream> out_;
  std::map<std::uint64_t, InStream> in_;

  Clock::time_point last_rx_, last_activity_;
  Clock::time_point tick_due_;  ///< when the next tick() is due (a late one: we were stalled)
  Duration tick_period_{0};
  bool goodbye_received_ = false;
  bool closing_ = false;
  bool closed_ = false;
  bool retiring_ = false;
  Duration retire_grace_{0};
};

}  // namespace grove::transport

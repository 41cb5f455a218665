#include "node/external_workload.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "node/shared_segment.hpp"
#include "node/shm_segments.hpp"
#include "optim/floats.hpp"
#include "transport/error.hpp"

namespace grove::node {

namespace {

using Clock = std::chrono::steady_clock;
using transport::ConfigError;
constexpr auto kSlice = std::chrono::milliseconds(200);  // waits re-check `stopping` this often
constexpr auto kHelloWait = std::chrono::seconds(10);
constexpr auto kStoreWait = std::chrono::seconds(120);
constexpr auto kWriteWait = std::chrono::seconds(10);

enum class Got { message, closed, timed_out, stopped };

std::string sys_error(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

}  // namespace

struct ExternalWorkload::Impl {
  Options o;
  int listen_fd = -1;
  int conn = -1;  // the attached trainer
  std::uint64_t pid = 0;
  std::optional<TrainerHello> first;  // bootstrap: the trainer waiting for its welcome
  RunConfig run;
  std::string run_name;
  bool bound = false;
  int shm_fd = -1;
  float* shm = nullptr;
  std::size_t params = 0;
  // Shared memory holds a θ the node set or took: a trainer that attaches later starts from it.
  // The node keeps no copy of its own (θ may be GBs): after a trainer died the segment holds
  // the θ it trained last (its parameters live there, or its last store).
  bool have_theta = false;
  bool pending_load = false;  // shared memory holds a θ the trainer has not loaded yet
  // ...in [load_lo, load_hi) (the rest is the trainer's θ already), or all of it
  std::size_t load_lo = 0;
  std::optional<std::size_t> load_hi;
  bool stored_once = false;  // the attached trainer has stored θ at least once
  bool save_due = false;     // a checkpoint was written: the trainer saves its own state
  double loss_sum = 0, eval_loss = NAN, last_value = NAN;
  Handoff stats;
  std::size_t losses = 0;
  // The trainer's collective segment (the latest; operations still running hold older ones).
  std::shared_ptr<SharedSegment> cseg;
  std::uint32_t cseg_gen = 0;

  bool stopping() const { return o.stopping && o.stopping(); }
  void state(const std::string& s) const {
    if (o.on_state) o.on_state(s);
  }

  // Writes one frame, waiting at most kWriteWait for the socket; false when the trainer is gone.
  bool send(int fd, const std::vector<std::uint8_t>& body) const {
    std::vector<std::uint8_t> f(4 + body.size());
    const auto n = static_cast<std::uint32_t>(body.size());
    f[0] = static_cast<std::uint8_t>(n >> 24);
    f[1] = static_cast<std::uint8_t>(n >> 16);
    f[2] = static_cast<std::uint8_t>(n >> 8);
    f[3] = static_cast<std::uint8_t>(n);
    std::memcpy(f.data() + 4, body.data(), body.size());
    const auto deadline = Clock::now() + kWriteWait;
    std::size_t at = 0;
    while (at < f.size()) {
      const ssize_t w = ::send(fd, f.data() + at, f.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        at += static_cast<std::size_t>(w);
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (Clock::now() >= deadline) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(kSlice.count()));
    }
    return true;
  }

  // Reads exactly n bytes; `deadline` (nullopt: none) and `stopping` end the wait. While it
  // waits, trainers that connect in addition are refused.
  Got read_exact(int fd, std::uint8_t* out, std::size_t n,
                 std::optional<Clock::time_point> deadline) {
    std::size_t at = 0;
    while (at < n) {
      if (stopping()) return Got::stopped;
      if (deadline && Clock::now() >= *deadline) return Got::timed_out;
      std::array<pollfd, 2> p{{{fd, POLLIN, 0}, {listen_fd, POLLIN, 0}}};
      const int r = ::poll(p.data(), listen_fd >= 0 ? 2 : 1, static_cast<int>(kSlice.count()));
      if (r < 0 && errno != EINTR) return Got::closed;
      if (r > 0 && (p[1].revents & POLLIN) && fd == conn) refuse_extra();
      if (r <= 0 || !(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t got = ::recv(fd, out + at, n - at, MSG_DONTWAIT);
      if (got == 0) return Got::closed;
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return Got::closed;
      }
      at += static_cast<std::size_t>(got);
    }
    return Got::message;
  }

  Got read_message(int fd, std::optional<Clock::time_point> deadline, TrainerMessage& out) {
    std::array<std::uint8_t, 4> h{};
    if (auto g = read_exact(fd, h.data(), 4, deadline); g != Got::message) return g;
    const std::uint32_t n = (std::uint32_t{h[0]} << 24) | (std::uint32_t{h[1]} << 16) |
                            (std::uint32_t{h[2]} << 8) | h[3];
    if (n > kMaxTrainerFrame) {
      spdlog::warn("trainer: a message of {} bytes (at most {}); closing its connection", n,
                   kMaxTrainerFrame);
      return Got::closed;
    }
    std::vector<std::uint8_t> body(n);
    if (auto g = read_exact(fd, body.data(), n, deadline); g != Got::message) return g;
    auto m = decode_trainer_message(body);
    if (!m) {
      spdlog::warn("trainer: malformed message ({}); closing its connection", m.why());
      return Got::closed;
    }
    out = std::move(*m);
    return Got::message;
  }

  // Someone connected while a trainer is attached: told why not, then closed.
  void refuse_extra() {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    send(fd, encode_refused("another trainer (pid " + std::to_string(pid) +
                            ") is attached to this node; one trainer per node"));
    ::close(fd);
    spdlog::info("trainer: refused a second trainer (pid {} is attached)", pid);
  }

  void drop(const std::string& why) {
    if (conn < 0) return;
    spdlog::warn(
        "trainer: pid {} {}; the node stays in the swarm and waits for a trainer to "
        "attach again",
        pid, why);
    ::close(conn);
    conn = -1;
    state("waiting for a trainer");
  }

  // Accepts connections until one says a hello that may train here (any hello before bind()).
  // Returns false when stopping.
  bool accept_trainer() {
    state("waiting for a trainer");
    for (;;) {
      if (stopping()) return false;
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(kSlice.count())) <= 0) continue;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      TrainerMessage m;
      const Got g = read_message(fd, Clock::now() + kHelloWait, m);
      if (g == Got::stopped) {
        ::close(fd);
        return false;
      }
      auto* h = g == Got::message ? std::get_if<TrainerHello>(&m) : nullptr;
      if (!h) {
        spdlog::warn("trainer: a connection that sent no hello; closed");
        ::close(fd);
        continue;
      }
      if (bound) {
        if (auto why = check_hello(*h, run); !why.empty()) {
          spdlog::warn("trainer: refused pid {}: {}", h->pid, why);
          send(fd, encode_refused(why));
          ::close(fd);
          continue;
        }
      } else if (h->version != kTrainerProtocol) {
        send(fd, encode_refused(check_hello(*h, run)));
        ::close(fd);
        continue;
      }
      conn = fd;
      pid = h->pid;
      if (!bound) {
        first = std::move(*h);
        return true;
      }
      welcome();
      return conn >= 0;
    }
  }

  void welcome() {
    // A trainer that attaches mid-run starts from the θ in shared memory: the node's latest, or
    // the one its previous trainer trained last.
    if (have_theta) {
      pending_load = true;
      load_lo = 0;
      load_hi.reset();
    }
    if (!send(conn,
              encode_welcome(o.shm_name, params * sizeof(float), run_name, run, o.state_file))) {
      drop("went away before its welcome");
      return;
    }
    stored_once = false;
    spdlog::info("trainer: pid {} attached ({} tensors, {} parameters, shared memory {})", pid,
                 run.model_tensors, params, o.shm_name);
    state("training");
  }
};

ExternalWorkload::ExternalWorkload(Options o) : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(o);
  const auto& path = impl_->o.socket_path;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path)
    throw ConfigError("trainer socket path must be 1 to " + std::to_string(sizeof a.sun_path - 1) +
                      " bytes: " + path);
  std::memcpy(a.sun_path, path.data(), path.size());
  // A socket file left by a node that died is replaced; one that answers belongs to a live node.
  if (const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    const bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(probe);
    if (live) throw ConfigError("another grove-node serves trainers at " + path);
  }
  ::unlink(path.c_str());
  impl_->listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (impl_->listen_fd < 0) throw ConfigError(sys_error("trainer socket"));
  const mode_t old = ::umask(0077);  // the socket file: this user only
  const int b = ::bind(impl_->listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::umask(old);
  if (b != 0 || ::listen(impl_->listen_fd, 4) != 0)
    throw ConfigError(sys_error(("trainer socket " + path).c_str()));
}

ExternalWorkload::~ExternalWorkload() {
  auto& i = *impl_;
  if (i.conn >= 0) ::close(i.conn);
  if (i.listen_fd >= 0) {
    ::close(i.listen_fd);
    ::unlink(i.o.socket_path.c_str());
  }
  if (i.shm) ::munmap(i.shm, i.params * sizeof(float));
  if (i.shm_fd >= 0) {
    ::close(i.shm_fd);
    ::shm_unlink(i.o.shm_name.c_str());
  }
}

std::optional<TrainerHello> ExternalWorkload::wait_for_first_trainer() {
  if (!impl_->accept_trainer()) return std::nullopt;
  return impl_->first;
}

void ExternalWorkload::bind(const RunConfig& run, const std::string& run_name) {
  auto& i = *impl_;
  i.run = run;
  i.run_name = run_name;
  i.params = static_cast<std::size_t>(run.model_params);
  const std::size_t bytes = i.params * sizeof(float);
  // Segments of nodes killed before they could remove theirs hold RAM (this node's last life's
  // included): free them first.
  sweep_stale_segments();
  ::shm_unlink(i.o.shm_name.c_str());  // ours, from our last life, if another node holds it
  i.shm_fd = ::shm_open(i.o.shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (i.shm_fd < 0) throw ConfigError(sys_error(("shared memory " + i.o.shm_name).c_str()));
  if (!lock_segment(i.shm_fd))
    throw ConfigError("shared memory " + i.o.shm_name + ": locked by another process");
  if (::ftruncate(i.shm_fd, static_cast<off_t>(bytes)) != 0)
    throw ConfigError(sys_error("shared memory size"));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, i.shm_fd, 0);
  if (p == MAP_FAILED)
    throw ConfigError(sys_error(("shared memory of " + std::to_string(bytes) + " bytes").c_str()));
  i.shm = static_cast<float*>(p);
  i.bound = true;
  if (i.first) {
    if (auto why = check_hello(*i.first, run); !why.empty()) {
      spdlog::warn("trainer: refused pid {}: {}", i.pid, why);
      i.send(i.conn, encode_refused(why));
      ::close(i.conn);
      i.conn = -1;
    } else {
      i.welcome();
    }
    i.first.reset();
  }
}

bool ExternalWorkload::attach() {
  auto& i = *impl_;
  while (i.conn < 0)
    if (!i.accept_trainer()) return false;
  return true;
}

std::string ExternalWorkload::describe() const {
  return "external model (" + std::to_string(impl_->run.model_tensors) + " tensors, " +
         std::to_string(impl_->params) + " parameters)";
}

std::size_t ExternalWorkload::num_params() const {
  return impl_->params;
}

namespace {
// Copies between θ in shared memory and the node's buffer a fragment at a time, handing the
// node's mapping of each shared fragment back once copied (madvise: the values stay in the
// segment, which the trainer maps): θ is the trainer's memory, not the node's. The node's side
// is handed back too when it is paged (`side`, optim/floats.hpp).
void copy_released(float* dst, const float* src, std::size_t n, float* shm,
                   const optim::Floats* side = nullptr, std::size_t side_at = 0) {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t lo = 0; lo < n; lo += optim::kFragment) {
    const std::size_t len = std::min(optim::kFragment, n - lo);
    std::memcpy(dst + lo, src + lo, len * sizeof(float));
    const auto base = reinterpret_cast<std::uintptr_t>(shm);
    const std::uintptr_t a = (base + lo * sizeof(float) + page - 1) / page * page;
    const std::uintptr_t b = (base + (lo + len) * sizeof(float)) / page * page;
    if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
    if (side) side->release(side_at + lo, side_at + lo + len);
  }
}
}  // namespace

void ExternalWorkload::get_params(std::span<float> out) const {
  fetch(out, nullptr);
}

void ExternalWorkload::get_params_into(optim::Floats& out) const {
  fetch(out, &out);
}

void ExternalWorkload::fetch(std::span<float> out, const optim::Floats* side) const {
  auto& i = *impl_;
  const auto t0 = Clock::now();
  while (i.conn >= 0) {
    if (!i.send(i.conn, encode_store())) {
      i.drop("went away");
      break;
    }
    TrainerMessage m;
    const Got g = i.read_message(i.conn, Clock::now() + kStoreWait, m);
    if (g == Got::message && std::holds_alternative<TrainerStored>(m)) {
      copy_released(out.data(), i.shm, out.size(), i.shm, side);
      // A trainer's first store moves its parameters into shared memory (a one-time copy):
      // counted apart from the hand-offs of a running trainer.
      if (i.stored_once) {
        ++i.stats.gets;
        i.stats.get_s += std::chrono::duration<double>(Clock::now() - t0).count();
      }
      i.stored_once = true;
      i.have_theta = true;
      return;
    }
    if (g == Got::stopped) break;
    i.drop(g == Got::timed_out ? "did not store its parameters within 120 s" : "went away");
  }
  // No trainer: the latest θ in shared memory.
  copy_released(out.data(), i.shm, out.size(), i.shm, side);
}

void ExternalWorkload::set_params(std::span<const float> in) {
  store(in, nullptr);
}

void ExternalWorkload::set_params_from(const optim::Floats& in) {
  store(in, &in);
}

void ExternalWorkload::set_params_part(const optim::Floats& in, std::size_t lo, std::size_t hi) {
  auto& i = *impl_;
  hi = std::min(hi, in.size());
  lo = std::min(lo, hi);
  // Shared memory holds the trainer's θ (stored at the end of its phase, or the node's last
  // one); only [lo, hi) changes. A load still pending widens to cover both.
  if (!i.have_theta || (i.pending_load && !i.load_hi)) return store(in, &in);
  const auto t0 = Clock::now();
  copy_released(i.shm + lo, in.data() + lo, hi - lo, i.shm + lo, &in, lo);
  ++i.stats.sets;
  i.stats.set_s += std::chrono::duration<double>(Clock::now() - t0).count();
  i.stats.set_bytes += static_cast<double>((hi - lo) * sizeof(float));
  if (i.pending_load) {
    i.load_lo = std::min(i.load_lo, lo);
    i.load_hi = std::max(*i.load_hi, hi);
  } else {
    i.load_lo = lo;
    i.load_hi = hi;
  }
  i.pending_load = true;
}

void ExternalWorkload::store(std::span<const float> in, const optim::Floats* side) {
  auto& i = *impl_;
  const auto t0 = Clock::now();
  copy_released(i.shm, in.data(), in.size(), i.shm, side);
  ++i.stats.sets;
  i.stats.set_s += std::chrono::duration<double>(Clock::now() - t0).count();
  i.stats.set_bytes += static_cast<double>(in.size() * sizeof(float));
  i.have_theta = true;
  i.pending_load = true;
  i.load_lo = 0;
  i.load_hi.reset();
}

std::vector<std::uint8_t> ExternalWorkload::save() const {
  impl_->save_due = !impl_->o.state_file.empty();
  return {};
}

// The trainer saves its own state (the inner optimiser's, its data position) where its welcome
// said, between two of its steps; it may take a while for a large optimiser state (a deadline of
// two minutes plus 16 bytes a parameter at 50 MB/s). A trainer that cannot is told nothing more:
// its state simply stays the last one saved.
void ExternalWorkload::save_trainer_state() {
  auto& i = *impl_;
  i.save_due = false;
  if (!i.send(i.conn, encode_save())) return i.drop("went away");
  const auto t0 = Clock::now();
  const auto wait = kStoreWait + std::chrono::milliseconds(static_cast<std::int64_t>(
                                     16.0 * static_cast<double>(i.params) / 50e3));
  TrainerMessage m;
  const Got g = i.read_message(i.conn, t0 + wait, m);
  if (g == Got::stopped) return;
  const auto* sv = g == Got::message ? std::get_if<TrainerSaved>(&m) : nullptr;
  if (!sv)
    return i.drop(
        g == Got::timed_out
            ? "did not save its state within " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(wait).count()) +
                  " s"
            : "went away while saving its state");
  if (!sv->why.empty())
    spdlog::warn("trainer: could not save its own state in {}: {}", i.o.state_file, sv->why);
  else
    spdlog::debug("trainer: saved its own state in {} ({:.1f} s)", i.o.state_file,
                  std::chrono::duration<double>(Clock::now() - t0).count());
}

StepResult ExternalWorkload::train_step(std::uint64_t) {
  auto& i = *impl_;
  for (;;) {
    if (!attach()) return {NAN, 0};
    if (i.save_due) {
      save_trainer_state();
      if (i.conn < 0) continue;
    }
    if (!i.send(i.conn, encode_go(i.pending_load, i.load_lo, i.load_hi))) {
      i.drop("went away");
      continue;
    }
    i.pending_load = false;
    // Its step, after any collectives it makes on the way.
    TrainerMessage m;
    Got g = Got::closed;
    bool served = true;  // false: an answer to a collective could not be sent
    for (;;) {
      g = i.read_message(i.conn, std::nullopt, m);
      if (g != Got::message) break;
      if (const auto* c = std::get_if<TrainerCollective>(&m))
        served = serve_collective(*c);
      else if (const auto* b = std::get_if<TrainerBuffer>(&m))
        served = serve_buffer(*b);
      else
        break;
      if (!served || i.stopping()) break;
    }
    if (g == Got::stopped) return {NAN, 0};
    if (g != Got::message || !served) {
      i.drop("went away");
      continue;
    }
    const auto* s = std::get_if<TrainerStep>(&m);
    if (!s && i.stopping()) return {NAN, 0};  // (stopping after a collective)
    if (!s) {
      i.drop("sent something other than a step or a collective");
      continue;
    }
    if (std::isfinite(s->loss)) {
      i.loss_sum += s->loss;
      ++i.losses;
    }
    if (std::isfinite(s->eval_loss)) i.eval_loss = s->eval_loss;
    return {s->loss, s->tokens};
  }
}

bool ExternalWorkload::serve_buffer(const TrainerBuffer& b) {
  auto& i = *impl_;
  if (!i.cseg || i.cseg->bytes() != b.bytes) {
    auto seg = SharedSegment::create(i.o.shm_name + "-c" + std::to_string(++i.cseg_gen),
                                     static_cast<std::size_t>(b.bytes));
    if (!seg) {
      // (The trainer learns of it from its next collective: the segment stays as it was.)
      spdlog::warn("trainer: no collective segment of {} bytes: {}", b.bytes, seg.why());
      return i.send(i.conn, encode_segment(i.cseg ? i.cseg->name() : std::string(),
                                           i.cseg ? i.cseg->bytes() : 0));
    }
    i.cseg = std::move(*seg);
  }
  return i.send(i.conn, encode_segment(i.cseg->name(), i.cseg->bytes()));
}

// The call's values sit at the start of the collective segment: its input (recv: where the
// received values go); a result goes right after the input when it fits there, else into a
// larger segment (the trainer maps it from the "segment" message that comes first).
bool ExternalWorkload::serve_collective(const TrainerCollective& c) {
  auto& i = *impl_;
  const bool recv = c.kind == CollectiveKind::recv;
  const std::size_t n = c.kind == CollectiveKind::barrier ? 0 : static_cast<std::size_t>(c.n);
  const std::size_t at = recv ? 0 : n;  // where the result goes
  const auto refuse = [&](const std::string& why) {
    return i.send(i.conn, encode_collective_done(false, why, 0, 0, 1, 0, 0));
  };
  if (!i.o.collective) return refuse("this node serves no collectives");
  if (n > 0 && (!i.cseg || i.cseg->values() < n))
    return refuse("the collective segment holds " + std::to_string(i.cseg ? i.cseg->values() : 0) +
                  " values, the call " + std::to_string(n) + " (ask for a larger buffer first)");
  auto seg = i.cseg;  // the call's segment, held while it runs
  optim::Floats values = n > 0 ? seg->view(0, n) : optim::Floats{};
  auto out = seg && !recv ? seg->allocator(at) : optim::FloatAllocator{};
  auto r = i.o.collective(c, std::move(values), std::move(out));
  if (!r.ok)
    return i.send(i.conn, encode_collective_done(false, r.why, r.call, r.rank, r.size, 0, 0));
  const std::size_t m = r.values.size();
  if (m > 0 && !(seg && r.values.data() == seg->data() + at)) {
    // The result is on the heap (it did not fit after the input): into a segment it fits.
    if (!i.cseg || i.cseg->values() < at + m) {
      auto bigger = SharedSegment::create(i.o.shm_name + "-c" + std::to_string(++i.cseg_gen),
                                          (at + m) * sizeof(float));
      if (!bigger)
        return i.send(i.conn, encode_collective_done(
                                  false, "no segment for the call's result: " + bigger.why(),
                                  r.call, r.rank, r.size, 0, 0));
      i.cseg = std::move(*bigger);
      if (!i.send(i.conn, encode_segment(i.cseg->name(), i.cseg->bytes()))) return false;
    }
    std::memcpy(i.cseg->data() + at, r.values.data(), m * sizeof(float));
  }
  return i.send(i.conn, encode_collective_done(true, {}, r.call, r.rank, r.size, m, at, r.joined));
}

double ExternalWorkload::evaluate() {
  auto& i = *impl_;
  // The trainer's own evaluation when it reports one, else its mean training loss since the last
  // call (the node has no data of its own); with nothing new, the last value again.
  if (std::isfinite(i.eval_loss))
    i.last_value = i.eval_loss;
  else if (i.losses)
    i.last_value = i.loss_sum / static_cast<double>(i.losses);
  i.eval_loss = NAN;
  i.loss_sum = 0;
  i.losses = 0;
  return i.last_value;
}

ExternalWorkload::Handoff ExternalWorkload::handoff(bool measure_memcpy) const {
  auto h = impl_->stats;
  h.bytes = static_cast<double>(impl_->params * sizeof(float));
  // A plain memcpy of up to 16 MiB between two buffers, the best of three, scaled to θ's bytes
  // (the rate does not depend on the size at these sizes; two model-sized buffers would add
  // twice θ's bytes to the node's peak memory).
  if (measure_memcpy && impl_->shm && impl_->params > 0) {
    const std::size_t n = std::min<std::size_t>(impl_->params, std::size_t{4} << 20);
    std::vector<float> a(impl_->shm, impl_->shm + n), b(n);  // both touched once
    for (int k = 0; k < 3; ++k) {
      const auto t0 = Clock::now();
      std::memcpy(b.data(), a.data(), n * sizeof(float));
      const double s = std::chrono::duration<double>(Clock::now() - t0).count() *
                       static_cast<double>(impl_->params) / static_cast<double>(n);
      if (!(s >= h.memcpy_s)) h.memcpy_s = s;
    }
  }
  return h;
}

void ExternalWorkload::say_goodbye(const std::string& why) {
  auto& i = *impl_;
  if (i.conn >= 0 && i.save_due) save_trainer_state();  // (the node's last checkpoint)
  if (i.conn < 0) return;
  i.send(i.conn, encode_bye(why));
  ::close(i.conn);
  i.conn = -1;
}

}  // namespace grove::node

// LanDiscovery against a private Avahi daemon.
//
// The round-trip tests start their own dbus-daemon (a private bus on a socket under
// /tmp/grove-avahi-<pid>/) and avahi-daemon (as root, in fresh network and mount namespaces when
// the kernel allows it: its own `lo`, its own /run, so nothing leaves the machine and parallel test
// processes do not see each other; otherwise restricted to `lo` with allow-interfaces=lo). Without
// root or the binaries they are skipped with the reason.
//
// DBUS_SYSTEM_BUS_ADDRESS is set once per process to that socket path (libdbus reads it once), so
// while no private daemon runs it points at nothing: that is the "no daemon" case.
#include "dht/lan_discovery.hpp"
#include "dht/runtime.hpp"

#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <avahi-client/client.h>
#include <avahi-client/publish.h>
#include <avahi-common/error.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace grove::dht {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Private dbus-daemon + avahi-daemon

fs::path private_dir() {
  return fs::path("/tmp") / ("grove-avahi-" + std::to_string(getpid()));
}
std::string bus_address() {
  return "unix:path=" + (private_dir() / "bus").string();
}

/// Points libdbus (and so avahi-client) at this process's private bus path, once.
void use_private_bus() {
  static std::once_flag once;
  std::call_once(once, [] { ::setenv("DBUS_SYSTEM_BUS_ADDRESS", bus_address().c_str(), 1); });
}

std::optional<std::string> find_binary(const char* name) {
  std::string path = ::getenv("PATH") ? ::getenv("PATH") : "";
  path += ":/usr/sbin:/usr/bin:/sbin:/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    const auto end = std::min(path.find(':', start), path.size());
    if (end > start) {
      const auto p = fs::path(path.substr(start, end - start)) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
    start = end + 1;
  }
  return std::nullopt;
}

/// Waits (with a deadline) for a child to exit; SIGKILLs it if it does not. Returns its status.
int reap(pid_t pid, std::chrono::milliseconds limit) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) ::kill(pid, SIGKILL);
    ::close(pidfd);
  } else {
    ::kill(pid, SIGKILL);  // no pidfd (old kernel): no way to wait with a deadline
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

/// Reads from `fd` until `pred(text)` holds, EOF, or the deadline. Returns what was read.
template <class Pred>
std::string read_until(int fd, Pred pred, Clock::time_point deadline, bool& eof) {
  std::string text;
  eof = false;
  while (!pred(text)) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) break;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[4096];
    const auto n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof = true;
      break;
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  return text;
}

class PrivateAvahi {
 public:
  /// Empty string on success, else why it could not start (the test skips with it).
  std::string start() {
    if (::geteuid() != 0) return "needs root to run a private avahi-daemon";
    const auto dbus = find_binary("dbus-daemon");
    const auto avahi = find_binary("avahi-daemon");
    if (!dbus) return "dbus-daemon not installed (Debian package dbus-daemon)";
    if (!avahi) return "avahi-daemon not installed (Debian package avahi-daemon)";
    use_private_bus();

    std::error_code ec;
    fs::create_directories(private_dir(), ec);
    fs::remove(private_dir() / "bus", ec);
    write_configs();
    if (auto why = start_dbus(*dbus); !why.empty()) return why;
    return start_avahi(*avahi);
  }

  /// Stops avahi-daemon (the clients see AVAHI_CLIENT_FAILURE); the bus keeps running.
  void stop_avahi() {
    if (avahi_pid_ > 0) {
      ::kill(avahi_pid_, SIGTERM);
      reap(avahi_pid_, 5s);
      avahi_pid_ = -1;
    }
    if (drain_.joinable()) drain_.join();  // the pipe reaches EOF when the daemon is gone
    if (avahi_out_ >= 0) ::close(avahi_out_);
    avahi_out_ = -1;
  }

  ~PrivateAvahi() {
    stop_avahi();
    if (dbus_pid_ > 0) {
      ::kill(dbus_pid_, SIGTERM);
      reap(dbus_pid_, 5s);
    }
    std::error_code ec;
    fs::remove_all(private_dir(), ec);
  }

  std::string log() {
    std::lock_guard lock(m_);
    return log_;
  }

 private:
  void write_configs() {
    std::ofstream(private_dir() / "bus.conf")
        << "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n"
           " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
           "<busconfig>\n  <type>system</type>\n  <listen>"
        << bus_address()
        << "</listen>\n  <auth>EXTERNAL</auth>\n"
           "  <policy context=\"default\">\n"
           "    <allow user=\"*\"/>\n    <allow own=\"*\"/>\n"
           "    <allow send_destination=\"*\" eavesdrop=\"true\"/>\n"
           "    <allow eavesdrop=\"true\"/>\n  </policy>\n</busconfig>\n";
    std::ofstream(private_dir() / "avahi.conf")
        << "[server]\nuse-ipv4=yes\nuse-ipv6=yes\nallow-interfaces=lo\nenable-dbus=yes\n"
           "ratelimit-interval-usec=1000000\nratelimit-burst=1000\n"
           "[wide-area]\nenable-wide-area=no\n"
           "[publish]\npublish-hinfo=no\npublish-workstation=no\npublish-addresses=yes\n";
  }

  std::string start_dbus(const std::string& bin) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return "pipe failed";
    const std::string conf = "--config-file=" + (private_dir() / "bus.conf").string();
    std::vector<std::string> args{bin, conf, "--nofork", "--print-address=3"};
    std::vector<char*> argv;  // prepared before fork: the child may only make system calls
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    dbus_pid_ = ::fork();
    if (dbus_pid_ == 0) {
      if (p[1] == 3)
        ::fcntl(3, F_SETFD, 0);
      else
        ::dup2(p[1], 3);  // dup2 clears O_CLOEXEC on fd 3
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(p[1]);
    if (dbus_pid_ < 0) {
      ::close(p[0]);
      return "fork failed";
    }
    bool eof = false;
    const auto out = read_until(
        p[0], [](const std::string& s) { return s.find('\n') != std::string::npos; },
        Clock::now() + 10s, eof);
    ::close(p[0]);
    if (out.find("unix:") == std::string::npos) return "dbus-daemon did not start: '" + out + "'";
    return {};
  }

  std::string start_avahi(const std::string& bin) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return "pipe failed";
    // Everything the child needs is prepared before fork (it may only make system calls).
    std::vector<std::string> args{
        bin,           "-f",          (private_dir() / "avahi.conf").string(), "--no-drop-root",
        "--no-chroot", "--no-rlimits"};
    std::vector<std::string> env{"DBUS_SYSTEM_BUS_ADDRESS=" + bus_address(),
                                 "PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    static const char kNoNs[] = "note: no private namespaces; avahi-daemon runs on the host's lo\n";

    avahi_pid_ = ::fork();
    if (avahi_pid_ == 0) {
      ::dup2(p[1], 1);
      ::dup2(p[1], 2);
      const int null = ::open("/dev/null", O_RDONLY);
      ::dup2(null, 0);
      // Own network namespace (only lo, brought up here) and own /run (pid file, socket).
      if (::unshare(CLONE_NEWNS | CLONE_NEWNET) == 0 &&
          ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
          ::mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") == 0) {
        const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ifreq ifr{};
        std::memcpy(ifr.ifr_name, "lo", 3);
        if (s >= 0 && ::ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
          ifr.ifr_flags |= IFF_UP;
          ::ioctl(s, SIOCSIFFLAGS, &ifr);
        }
      } else {
        (void)!::write(2, kNoNs, sizeof kNoNs - 1);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(p[1]);
    if (avahi_pid_ < 0) {
      ::close(p[0]);
      return "fork failed";
    }
    avahi_out_ = p[0];
    bool eof = false;
    const auto out = read_until(
        avahi_out_,
        [](const std::string& s) { return s.find("Server startup complete") != std::string::npos; },
        Clock::now() + 20s, eof);
    {
      std::lock_guard lock(m_);
      log_ = out;
    }
    if (out.find("Server startup complete") == std::string::npos) {
      stop_avahi();
      return "avahi-daemon did not start:\n" + out;
    }
    // Keep draining its output so it never blocks on a full pipe.
    drain_ = std::thread([this] {
      char buf[4096];
      for (;;) {
        const auto n = ::read(avahi_out_, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        std::lock_guard lock(m_);
        log_.append(buf, static_cast<std::size_t>(n));
      }
    });
    return {};
  }

  pid_t dbus_pid_ = -1;
  pid_t avahi_pid_ = -1;
  int avahi_out_ = -1;
  std::thread drain_;
  std::mutex m_;
  std::string log_;
};

// ---------------------------------------------------------------------------------------------
// Helpers

/// Runs the io_context until `pred` holds or the deadline passes (no sleeps: run_one_for returns
/// as soon as a handler ran; the short slice lets us re-check state changed by other threads).
template <class Pred>
bool run_until(boost::asio::io_context& io, Pred pred, std::chrono::milliseconds limit = 20s) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    io.run_one_for(std::min<Clock::duration>(deadline - now, 20ms));
  }
  return true;
}

std::string hex_id(char c) {
  return std::string(kLanNodeIdHexLen, c);
}

LanDiscoveryOptions options(std::string swarm, std::uint16_t port, char id) {
  LanDiscoveryOptions o;
  o.swarm = std::move(swarm);
  o.port = port;
  o.node_id_hex = hex_id(id);
  return o;
}

/// Collects the peers one LanDiscovery reports.
struct Seen {
  std::vector<LanPeer> peers;
  std::function<void(LanPeer)> sink() {
    return [this](LanPeer p) { peers.push_back(std::move(p)); };
  }
  bool has(const std::string& id) const {
    return std::any_of(peers.begin(), peers.end(), [&](auto& p) { return p.id_hex == id; });
  }
  const LanPeer* find(const std::string& id) const {
    for (auto& p : peers)
      if (p.id_hex == id) return &p;
    return nullptr;
  }
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class LanDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    use_private_bus();
    if (auto why = daemon_.start(); !why.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "---- avahi-daemon log ----\n" << daemon_.log() << "----\n";
  }
  using Result = transport::Result<std::unique_ptr<LanDiscovery>>;
  std::unique_ptr<LanDiscovery> start(LanDiscoveryOptions o, Seen& seen) {
    auto r = LanDiscovery::start(io_.get_executor(), std::move(o), seen.sink());
    EXPECT_TRUE(r) << r.error().message();
    return r ? std::move(r).value() : nullptr;
  }

  PrivateAvahi daemon_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
};

// ---------------------------------------------------------------------------------------------
// Tests

TEST(LanDiscoveryNoDaemon, StartFailsFastWithoutDaemon) {
  use_private_bus();  // the private bus path; no daemon runs on it here
  ASSERT_FALSE(fs::exists(private_dir() / "bus"));
  boost::asio::io_context io;
  int calls = 0;
  const auto t0 = Clock::now();
  auto r = LanDiscovery::start(io.get_executor(), options("alpha", 4000, 'a'),
                               [&](LanPeer) { ++calls; });
  const auto took = Clock::now() - t0;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), transport::errc::unreachable);
  EXPECT_LT(took, 5s);
  io.poll();
  EXPECT_EQ(calls, 0);
}

TEST(LanDiscoveryConfig, InvalidOptionsThrowConfigError) {
  boost::asio::io_context io;
  auto start = [&](LanDiscoveryOptions o) {
    return LanDiscovery::start(io.get_executor(), std::move(o), [](LanPeer) {});
  };
  auto o = options("alpha", 4000, 'a');
  o.node_id_hex = "abcd";
  EXPECT_THROW(start(o), transport::ConfigError);
  o = options("alpha", 4000, 'a');
  o.node_id_hex[10] = 'g';
  EXPECT_THROW(start(o), transport::ConfigError);
  EXPECT_THROW(start(options("", 4000, 'a')), transport::ConfigError);
  EXPECT_THROW(start(options(std::string(65, 's'), 4000, 'a')), transport::ConfigError);
  EXPECT_THROW(start(options("alpha", 0, 'a')), transport::ConfigError);
  o = options("alpha", 4000, 'a');
  o.instance_name = std::string(64, 'n');
  EXPECT_THROW(start(o), transport::ConfigError);
}

TEST_F(LanDiscoveryTest, SameSwarmFindEachOtherOtherSwarmIgnored) {
  Seen seen_a, seen_b, seen_c, seen_d;
  auto a = start(options("alpha", 40001, 'a'), seen_a);
  auto b = start(options("alpha", 40002, 'b'), seen_b);
  auto c = start(options("beta", 40003, 'c'), seen_c);
  auto d = start(options("beta", 40004, 'd'), seen_d);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(a->instance_name(), "grove-aaaaaaaa");

  const auto ta = Clock::now();
  ASSERT_TRUE(run_until(io_,
                        [&] {
                          return seen_a.has(hex_id('b')) && seen_b.has(hex_id('a')) &&
                                 seen_c.has(hex_id('d')) && seen_d.has(hex_id('c'));
                        }))
      << "a saw " << seen_a.peers.size() << ", b saw " << seen_b.peers.size();
  for (auto& p : seen_a.peers) std::cerr << "a saw " << p.address << " " << p.id_hex << "\n";
  std::cerr << "discovered each other in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - ta).count()
            << " ms\n";
  // (A peer may browse b's record before b's own "established" callback has run: wait for it.)
  EXPECT_TRUE(run_until(io_, [&] { return a->published() && b->published(); }));

  const LanPeer* pb = seen_a.find(hex_id('b'));
  EXPECT_TRUE(ends_with(pb->address, ":40002")) << pb->address;
  EXPECT_TRUE(pb->address.starts_with("127.0.0.1:") || pb->address.starts_with("[::1]:"))
      << pb->address;
  EXPECT_EQ(pb->swarm, "alpha");
  EXPECT_TRUE(ends_with(seen_b.find(hex_id('a'))->address, ":40001"));

  io_.poll();  // whatever else is queued
  for (const Seen* s : {&seen_a, &seen_b})
    for (auto& p : s->peers) {
      EXPECT_EQ(p.swarm, "alpha");
      EXPECT_NE(p.id_hex, hex_id('c'));
      EXPECT_NE(p.id_hex, hex_id('d'));
    }
  for (const Seen* s : {&seen_c, &seen_d})
    for (auto& p : s->peers) EXPECT_EQ(p.swarm, "beta");
  EXPECT_FALSE(seen_a.has(hex_id('a')));  // never ourselves
  EXPECT_FALSE(seen_b.has(hex_id('b')));
}

TEST_F(LanDiscoveryTest, NameCollisionPicksAlternativeName) {
  Seen seen_a, seen_b;
  auto oa = options("alpha", 40011, 'a');
  auto ob = options("alpha", 40012, 'b');
  oa.instance_name = ob.instance_name = "grove-node";
  auto a = start(oa, seen_a);
  auto b = start(ob, seen_b);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(run_until(io_, [&] {
    return a->published() && b->published() && seen_a.has(hex_id('b')) && seen_b.has(hex_id('a'));
  }));
  EXPECT_NE(a->instance_name(), b->instance_name());
  EXPECT_TRUE(a->instance_name() == "grove-node #2" || b->instance_name() == "grove-node #2")
      << a->instance_name() << " / " << b->instance_name();
}

TEST_F(LanDiscoveryTest, PublishOnlyAndBrowseOnly) {
  Seen seen_pub, seen_browse;
  auto op = options("alpha", 40021, 'e');
  op.browse = false;
  auto ob = options("alpha", 0, 'f');
  ob.publish = false;  // port 0 is fine when not publishing
  auto pub = start(op, seen_pub);
  auto browse = start(ob, seen_browse);
  ASSERT_TRUE(pub && browse);
  ASSERT_TRUE(run_until(io_, [&] { return seen_browse.has(hex_id('e')); }));
  io_.poll();
  EXPECT_TRUE(seen_pub.peers.empty());
  EXPECT_FALSE(browse->published());
}

/// Publishes raw DNS-SD services with hand-made TXT records, as a hostile LAN host could.
class RawPublisher {
 public:
  RawPublisher() {
    poll_ = avahi_threaded_poll_new();
    int err = 0;
    client_ = avahi_client_new(
        avahi_threaded_poll_get(poll_), static_cast<AvahiClientFlags>(0),
        [](AvahiClient*, AvahiClientState, void*) {}, nullptr, &err);
    if (client_)
      group_ = avahi_entry_group_new(
          client_, [](auto...) {}, nullptr);
    if (poll_ && client_) avahi_threaded_poll_start(poll_);
  }
  ~RawPublisher() {
    if (poll_) avahi_threaded_poll_stop(poll_);
    if (client_) avahi_client_free(client_);
    if (poll_) avahi_threaded_poll_free(poll_);
  }
  bool ok() const { return group_ != nullptr; }
  int add(const char* name, std::uint16_t port, std::vector<std::string> txt) {
    AvahiStringList* l = nullptr;
    for (auto& t : txt)
      l = avahi_string_list_add_arbitrary(l, reinterpret_cast<const std::uint8_t*>(t.data()),
                                          t.size());
    avahi_threaded_poll_lock(poll_);
    const int r = avahi_entry_group_add_service_strlst(group_, AVAHI_IF_UNSPEC, AVAHI_PROTO_UNSPEC,
                                                       static_cast<AvahiPublishFlags>(0), name,
                                                       "_grove._tcp", nullptr, nullptr, port, l);
    avahi_threaded_poll_unlock(poll_);
    avahi_string_list_free(l);
    return r;
  }
  int commit() {
    avahi_threaded_poll_lock(poll_);
    const int r = avahi_entry_group_commit(group_);
    avahi_threaded_poll_unlock(poll_);
    return r;
  }

 private:
  AvahiThreadedPoll* poll_ = nullptr;
  AvahiClient* client_ = nullptr;
  AvahiEntryGroup* group_ = nullptr;
};

TEST_F(LanDiscoveryTest, HostileTxtRecordsAreIgnored) {
  RawPublisher raw;
  ASSERT_TRUE(raw.ok());
  const std::string good = "swarm=alpha";
  ASSERT_EQ(raw.add("bad-short-id", 40031, {good, "id=abcd"}), AVAHI_OK);
  ASSERT_EQ(raw.add("bad-long-id", 40032, {good, "id=" + std::string(65, '1')}), AVAHI_OK);
  ASSERT_EQ(raw.add("bad-nonhex-id", 40033, {good, "id=" + std::string(64, 'z')}), AVAHI_OK);
  ASSERT_EQ(
      raw.add("bad-long-swarm", 40034, {"swarm=" + std::string(65, 'x'), "id=" + hex_id('2')}),
      AVAHI_OK);
  ASSERT_EQ(raw.add("bad-no-swarm", 40035, {"id=" + hex_id('3')}), AVAHI_OK);
  ASSERT_EQ(
      raw.add("bad-nul-swarm", 40036, {std::string("swarm=alpha\0x", 13), "id=" + hex_id('4')}),
      AVAHI_OK);
  ASSERT_EQ(raw.add("bad-port-zero", 0, {good, "id=" + hex_id('5')}), AVAHI_OK);
  // An upper-case id is valid and reported lower-case.
  ASSERT_EQ(raw.add("good-upper", 40037, {good, "id=" + std::string(64, 'F'), "v=1"}), AVAHI_OK);
  ASSERT_EQ(raw.commit(), AVAHI_OK);

  Seen seen;
  auto a = start(options("alpha", 40030, 'a'), seen);
  ASSERT_TRUE(a);
  ASSERT_TRUE(run_until(io_, [&] { return seen.has(hex_id('f')); }));
  io_.poll();
  for (auto& p : seen.peers) EXPECT_EQ(p.id_hex, hex_id('f')) << p.address;
  EXPECT_TRUE(ends_with(seen.find(hex_id('f'))->address, ":40037"));
}

TEST_F(LanDiscoveryTest, NoCallbackAfterDestruction) {
  Seen seen_b;
  int calls_a = 0;
  std::unique_ptr<LanDiscovery> a;
  auto r = LanDiscovery::start(io_.get_executor(), options("alpha", 40041, 'a'), [&](LanPeer) {
    ++calls_a;
    a.reset();  // destroying from inside on_peer is allowed
  });
  ASSERT_TRUE(r) << r.error().message();
  a = std::move(r).value();
  auto b = start(options("alpha", 40042, 'b'), seen_b);
  auto b2 = start(options("alpha", 40043, 'c'), seen_b);
  ASSERT_TRUE(b && b2);
  ASSERT_TRUE(run_until(io_, [&] { return calls_a > 0 && seen_b.has(hex_id('a')); }));
  EXPECT_EQ(a, nullptr);
  // More announcements keep arriving for b; none reaches a's callback.
  ASSERT_TRUE(run_until(io_, [&] { return seen_b.has(hex_id('c')); }));
  io_.poll();
  EXPECT_EQ(calls_a, 1);

  // Destroying with reports still queued on the executor: they are dropped.
  int calls_c = 0;
  auto rc = LanDiscovery::start(io_.get_executor(), options("alpha", 40044, 'd'),
                                [&](LanPeer) { ++calls_c; });
  ASSERT_TRUE(rc);
  auto c = std::move(rc).value();
  ASSERT_TRUE(run_until(io_, [&] { return calls_c > 0; }));
  c.reset();
  const int before = calls_c;
  io_.poll();
  EXPECT_EQ(calls_c, before);
}

TEST_F(LanDiscoveryTest, DaemonGoingAwayStopsQuietly) {
  Seen seen_a, seen_b;
  auto a = start(options("alpha", 40051, 'a'), seen_a);
  auto b = start(options("alpha", 40052, 'b'), seen_b);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(run_until(io_, [&] { return seen_a.has(hex_id('b')); }));
  EXPECT_TRUE(a->active());
  daemon_.stop_avahi();
  ASSERT_TRUE(run_until(
      io_, [&] { return !a->active() && !b->active(); }, 10s));
  EXPECT_FALSE(a->published());
  a.reset();  // frees the client on a dead connection: no crash, no hang
  b.reset();
  io_.poll();

  // The bus is still there but no Avahi daemon is on it: start() fails fast.
  const auto t0 = Clock::now();
  auto r = LanDiscovery::start(io_.get_executor(), options("alpha", 40053, 'c'), [](LanPeer) {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), transport::errc::unreachable);
  EXPECT_LT(Clock::now() - t0, 5s);
}

}  // namespace
}  // namespace grove::dht

namespace grove::dht {
namespace {

// Two DHT nodes with no --peer at all find each other through the LAN and form one run view.
TEST_F(LanDiscoveryTest, DhtRuntimesWithoutPeersFindEachOther) {
  std::vector<std::shared_ptr<transport::Host>> hosts;
  std::vector<std::shared_ptr<DhtRuntime>> rts;
  std::vector<std::shared_ptr<Membership>> runs;
  std::vector<std::unique_ptr<LanDiscovery>> lans;
  MembershipOptions mo;
  mo.ttl = Time(3000);
  mo.publish_every = Time(1000);
  mo.poll_every = Time(700);
  for (int i = 0; i < 2; ++i) {
    transport::HostOptions ho;
    ho.listen = "127.0.0.1:0";
    hosts.push_back(transport::Host::create(io_, transport::Identity::generate(), ho));
    rts.push_back(DhtRuntime::create(hosts.back(), DhtOptions{}, 100 + i));
    hosts.back()->start();
    rts.back()->start();
    lans.push_back(discover_on_lan(rts.back(), *hosts.back(), "lan-swarm"));
    ASSERT_TRUE(lans.back());
    MemberInfo self;
    self.addresses = {hosts.back()->address()};
    runs.push_back(rts.back()->join("lan-run", mo, self));
  }
  const auto t0 = Clock::now();
  const bool ok = run_until(
      io_, [&] { return runs[0]->size() == 2 && runs[1]->size() == 2; }, 30s);
  EXPECT_TRUE(ok) << "views " << runs[0]->size() << " and " << runs[1]->size();
  std::cerr << "LAN-only nodes share one run view after "
            << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()
            << " ms\n";
  lans.clear();
  for (auto& rt : rts) rt->stop();
  for (auto& h : hosts) h->shutdown();
  // Wait for the goodbyes to close every session (this thread runs the io_context).
  EXPECT_TRUE(run_until(
      io_, [&] { return hosts[0]->stats().sessions == 0 && hosts[1]->stats().sessions == 0; },
      10s));
  transport::quiesce_worker_pool();
  io_.poll();
}

}  // namespace
}  // namespace grove::dht

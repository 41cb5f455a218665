// Real dht_peer processes on loopback: they find each other through one bootstrap node, keep
// a run's member view, store and fetch records across processes, and notice a SIGKILLed peer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Proc {
 public:
  explicit Proc(std::vector<std::string> args) {
    int in[2], out[2];
    // O_CLOEXEC: later children must not inherit this child's stdin (it would never see EOF).
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    in_ = in[1];
    out_ = out[0];
  }
  ~Proc() {
    kill9();
    close(in_);
    close(out_);
  }
  void send(const std::string& line) {
    const std::string l = line + "\n";
    (void)!write(in_, l.data(), l.size());
  }
  /// Next output line starting with `prefix`, waiting at most `limit`.
  std::optional<std::string> expect(const std::string& prefix, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (true) {
      for (auto nl = buf_.find('\n'); nl != std::string::npos; nl = buf_.find('\n')) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        last_.push_back(line);
        if (line.rfind(prefix, 0) == 0) return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (left <= 0ms) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[4096];
      const ssize_t n = read(out_, b, sizeof b);
      if (n <= 0) return std::nullopt;  // the process ended
      buf_.append(b, static_cast<std::size_t>(n));
    }
  }
  /// Waits until the latest "view N" line says `n`.
  bool view_is(std::size_t n, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    const std::string want = "view " + std::to_string(n);
    if (!last_view_.empty() && last_view_ == want) return true;
    while (Clock::now() < end) {
      auto l = expect("view ",
                      std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()));
      if (!l) return false;
      last_view_ = *l;
      if (*l == want) return true;
    }
    return false;
  }
  void kill9() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  /// Closes stdin (a clean stop) and waits for the exit code.
  int finish(std::chrono::milliseconds limit) {
    close(in_);
    in_ = -1;
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      pollfd p{out_, POLLIN, 0};
      char b[4096];
      if (poll(&p, 1, 50) > 0 && read(out_, b, sizeof b) <= 0) {
        // stdout closed: the process is exiting; loop to reap it
      }
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buf_, last_view_;
  std::vector<std::string> last_;
};

std::string peer_binary() {
  return DHT_PEER_BINARY;
}

TEST(DhtIntegration, ProcessesFormASwarmShareRecordsAndSurviveKills) {
  signal(SIGPIPE, SIG_IGN);
  const std::string bin = peer_binary();
  std::vector<std::unique_ptr<Proc>> p;
  std::vector<std::string> addr;
  auto start = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{bin, "--ttl-ms", "3000"};
    args.insert(args.end(), extra.begin(), extra.end());
    p.push_back(std::make_unique<Proc>(args));
    auto ready = p.back()->expect("ready ", 10s);
    if (!ready) return false;
    addr.push_back(ready->substr(ready->rfind(' ') + 1));
    return true;
  };
  ASSERT_TRUE(start({}));
  for (int i = 1; i < 5; ++i) ASSERT_TRUE(start({"--peer", addr[0]}));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(p[i]->view_is(5, 20s)) << "process " << i;
  // A record written by one process is read by another.
  p[1]->send("put greeting hello-from-1");
  auto put = p[1]->expect("put greeting", 10s);
  ASSERT_TRUE(put);
  EXPECT_NE(*put, "put greeting 0");
  p[4]->send("get greeting");
  auto got = p[4]->expect("got greeting", 10s);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, "got greeting hello-from-1");
  // SIGKILL one member: the others drop it within 2 TTL (+ a poll and scheduling slack).
  const auto killed = Clock::now();
  p[2]->kill9();
  for (int i : {0, 1, 3, 4}) EXPECT_TRUE(p[i]->view_is(4, 10s)) << "process " << i;
  std::printf(
      "killed member left every view after %lld ms (TTL 3000 ms)\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count()));
  // The bootstrap node dies too; the rest go on and still read the record.
  p[0]->kill9();
  for (int i : {1, 3, 4}) EXPECT_TRUE(p[i]->view_is(3, 10s)) << "process " << i;
  p[3]->send("get greeting");
  got = p[3]->expect("got greeting", 10s);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, "got greeting hello-from-1");
  // A newcomer whose first bootstrap contact is dead joins through the second.
  ASSERT_TRUE(start({"--peer", addr[0], "--peer", addr[1]}));
  EXPECT_TRUE(p[5]->view_is(4, 20s));
  for (int i : {1, 3, 4}) EXPECT_TRUE(p[i]->view_is(4, 20s)) << "process " << i;
  // A clean stop: the process leaves the run (others see it at once) and exits 0.
  EXPECT_EQ(p[4]->finish(10s), 0);
  for (int i : {1, 3, 5}) EXPECT_TRUE(p[i]->view_is(3, 10s)) << "process " << i;
}

}  // namespace

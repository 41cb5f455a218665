// Real grove-node processes on loopback: a swarm trains and its loss drops, a node killed with
// SIGKILL resumes from its checkpoint, SIGTERM leaves cleanly (garbage on the port does not
// disturb the node), a node without the swarm key is refused, status and the run-time switch, a
// joiner mid-run starts near the swarm's loss, a DiLoCo swarm trains and survives a SIGKILLed
// member, bad arguments exit 2.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

// GCC 12 reports -Wmaybe-uninitialized inside <regex>'s std::function under the sanitizers (a
// false positive in the library's own code).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// A grove-node child whose stdout (and stderr) is read line by line.
class Proc {
 public:
  explicit Proc(std::vector<std::string> args) {
    args.insert(args.begin(), GROVE_NODE_BINARY);
    int out[2];
    if (pipe2(out, O_CLOEXEC)) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      dup2(out[1], 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];
  }
  ~Proc() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
  }
  /// The next line matching `re` (searching), waiting at most `limit`; the match in *m.
  std::optional<std::string> expect(const std::regex& re, std::chrono::milliseconds limit,
                                    std::smatch* m = nullptr) {
    const auto end = Clock::now() + limit;
    for (;;) {
      for (auto nl = buf_.find('\n'); nl != std::string::npos; nl = buf_.find('\n')) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        log_ += line + "\n";
        std::smatch mm;
        if (std::regex_search(line, mm, re)) {
          if (m) {
            held_ = line;  // smatch refers into the string: keep it alive
            std::regex_search(held_, *m, re);
          }
          return line;
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (left <= 0ms) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[4096];
      const ssize_t n = read(out_, b, sizeof b);
      if (n <= 0) return std::nullopt;  // the process closed its output
      buf_.append(b, static_cast<std::size_t>(n));
    }
  }
  /// Waits for the process to exit (at most `limit`); its exit code, or -1.
  int wait_exit(std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      // Drain output so the child never blocks on a full pipe; EOF means it is exiting.
      expect(std::regex("$^"), 200ms);
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    return -1;
  }
  void signal(int sig) { ::kill(pid_, sig); }
  void kill9() {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    exited_ = true;
  }
  const std::string& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool exited_ = false;
  std::string buf_, log_, held_;
};

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("grove-proc-" + std::to_string(getpid()) + "-" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

// A fast mlp run: 20 inner steps a round, 1 s matchmaking windows; progress lines unless not
// `progress`.
std::vector<std::string> bootstrap_args(const TempDir& d, const std::string& name,
                                        std::vector<std::string> extra = {}, bool progress = true) {
  std::vector<std::string> a = {
      "--bootstrap", "--workload",   "mlp",   "--model-size", "tiny", "--inner-steps",
      "20",          "--lr",         "0.01",  "--warmup",     "10",   "--schedule-steps",
      "2000",        "--eval-every", "20",    "--window-ms",  "1000", "--listen",
      "127.0.0.1:0", "--state-dir",  d / name};
  if (!progress) a.push_back("--no-progress");
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A node joining through `addr`, with its progress lines and the swarm key the bootstrap node
// ("n0") created in its state dir.
std::vector<std::string> join_args(const TempDir& d, const std::string& name,
                                   const std::string& addr, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--peer",      addr,     "--listen",         "127.0.0.1:0",
                                "--state-dir", d / name, "--swarm-key-file", d / "n0/swarm.key"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string listen_address(Proc& p) {
  std::smatch m;
  auto l = p.expect(std::regex(R"(listening (\S+))"), 30s, &m);
  if (!l) return {};
  return m[1];
}

// A bootstrap node's listening address and the eval loss of its fresh model (its "start" line);
// false when either does not come.
bool started(Proc& p, std::string& addr, double& fresh) {
  addr = listen_address(p);
  std::smatch m;
  if (addr.empty() || !p.expect(std::regex(R"(start +eval loss ([0-9.e-]+))"), 30s, &m))
    return false;
  fresh = std::stod(m[1]);
  return true;
}

const std::regex kStopped(R"(stopped at step (\d+), round (\d+): eval loss ([0-9.e-]+))");

// Three nodes, n0 bootstrapping with `run` (and 600 steps, its metrics in m0.jsonl), two joiners
// of 400 steps: each joiner syncs, averages (its round line matches `averaged`) and ends below
// half the fresh loss, as does n0.
void three_nodes_train(const TempDir& d, std::vector<std::string> run, const std::regex& averaged) {
  run.insert(run.end(), {"--max-steps", "600", "--metrics", d / "m0.jsonl"});
  Proc n0(bootstrap_args(d, "n0", run));
  const auto addr = listen_address(n0);
  ASSERT_FALSE(addr.empty()) << n0.log();
  std::smatch m;
  ASSERT_TRUE(n0.expect(std::regex(R"(step +20 .* eval ([0-9.e-]+))"), 30s, &m)) << n0.log();
  const double first_eval = std::stod(m[1]);
  std::vector<std::unique_ptr<Proc>> joiners;
  for (int i = 1; i <= 2; ++i)
    joiners.push_back(std::make_unique<Proc>(
        join_args(d, "n" + std::to_string(i), addr, {"--max-steps", "400"})));
  for (auto& j : joiners) {
    ASSERT_TRUE(j->expect(std::regex("synced +round"), 60s)) << j->log();
    // It averages with the others, not only locally.
    ASSERT_TRUE(j->expect(averaged, 60s)) << j->log();
    ASSERT_TRUE(j->expect(kStopped, 120s, &m)) << j->log();
    EXPECT_LT(std::stod(m[3]), 0.5 * first_eval) << j->log();
    EXPECT_EQ(j->wait_exit(30s), 0) << j->log();
  }
  ASSERT_TRUE(n0.expect(kStopped, 120s, &m)) << n0.log();
  EXPECT_EQ(m[1], "600");
  EXPECT_LT(std::stod(m[3]), 0.5 * first_eval);
  EXPECT_EQ(n0.wait_exit(30s), 0) << n0.log();
}

TEST(NodeProcess, ThreeNodesTrainTogetherAndTheirLossDrops) {
  TempDir d;
  ASSERT_NO_FATAL_FAILURE(three_nodes_train(d, {}, std::regex("noloco with ")));
  EXPECT_TRUE(fs::exists(d.path / "n0" / "checkpoint.bin"));
  // The metrics: every line carries the documented fields; rounds averaged with partners; a stop.
  std::ifstream metrics(d / "m0.jsonl");
  std::map<std::string, int> events;
  int averaged = 0;
  for (std::string line; std::getline(metrics, line);) {
    for (const char* key :
         {"time", "node", "event", "step", "round", "loss", "eval_loss", "partners", "bytes_sent",
          "bytes_received", "sync_ms", "members", "param_hash"})
      EXPECT_NE(line.find("\"" + std::string(key) + "\":"), std::string::npos)
          << key << ": " << line;
    std::smatch e;
    ASSERT_TRUE(std::regex_search(line, e, std::regex(R"re("event":"(\w+)")re"))) << line;
    ++events[e[1]];
    averaged += e[1] == "round" && line.find("\"partners\":[\"") != std::string::npos;
  }
  EXPECT_EQ(events["start"], 1);
  EXPECT_EQ(events["stop"], 1);
  EXPECT_EQ(events["eval"], 30);  // every 20 of 600 steps
  EXPECT_GE(averaged, 10);
}

// NoLoCo's variant as run options: the paper's rule in groups of three with a look-ahead start
// (the look-ahead belongs with the paper's rule: grove-node's is a Nesterov step already); the
// joiners average with both others (their round lines: "noloco with ID +1").
TEST(NodeProcess, NoLoCoInGroupsOfThreeWithALookAheadTrainsTogether) {
  TempDir d;
  three_nodes_train(
      d, {"--noloco-variant", "paper", "--noloco-group", "3", "--noloco-lookahead", "0.5"},
      std::regex(R"(noloco with \S+ \+1)"));
}

TEST(NodeProcess, KilledWithSigkillResumesFromItsCheckpoint) {
  TempDir d;
  std::smatch m;
  {
    Proc p(bootstrap_args(d, "n0"));
    ASSERT_TRUE(p.expect(std::regex(R"(step +(\d+) +round +5 )"), 60s, &m)) << p.log();
    p.kill9();
  }
  // Restart on the same state dir (no --bootstrap): the run and its state come from the
  // checkpoint, and training continues past it. Checkpoints are written in the background: the
  // last complete one is at most two rounds behind the last printed round.
  Proc p({"--listen", "127.0.0.1:0", "--state-dir", d / "n0", "--max-steps", "200"});
  ASSERT_TRUE(p.expect(std::regex(R"(resumed +round (\d+), step (\d+))"), 60s, &m)) << p.log();
  EXPECT_GE(std::stoi(m[1]), 3);
  EXPECT_GE(std::stoi(m[2]), 60);
  ASSERT_TRUE(p.expect(kStopped, 120s, &m)) << p.log();
  EXPECT_EQ(m[1], "200");
  EXPECT_EQ(p.wait_exit(30s), 0) << p.log();
}

// Restarted on its state dir with neither --peer nor the key (both are kept there), a killed
// node rejoins its swarm through the contacts it saved, takes the swarm's state and is averaging
// with it again within two rounds.
TEST(NodeProcess, ARestartedNodeWithoutPeerRejoinsItsSwarm) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0"));
  const auto addr = listen_address(n0);
  ASSERT_FALSE(addr.empty()) << n0.log();
  const std::regex averaged(R"(step +\d+ +round +\d+ .* noloco with )");
  const std::regex round_line(R"(step +\d+ +round +\d+ .* noloco (with|local-only))");
  {
    Proc n1(join_args(d, "n1", addr));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(n1.expect(averaged, 60s)) << n1.log();
    n1.kill9();
  }
  std::ifstream saved(d / "n1/contacts");
  const std::string contacts{std::istreambuf_iterator<char>(saved), {}};
  EXPECT_NE(contacts.find(addr + "\n"), std::string::npos)  // saved while n1 trained
      << contacts;

  Proc again({"--listen", "127.0.0.1:0", "--state-dir", d / "n1", "--max-steps", "400"});
  ASSERT_TRUE(again.expect(std::regex("rejoining: 1 of the 1 saved contacts answered"), 60s))
      << again.log();
  ASSERT_TRUE(again.expect(std::regex("synced +round"), 60s)) << again.log();
  std::smatch m;
  bool with = false;
  for (int i = 0; i < 2 && !with; ++i) {
    ASSERT_TRUE(again.expect(round_line, 60s, &m)) << again.log();
    with = m[1] == "with";
  }
  EXPECT_TRUE(with) << again.log();
  again.signal(SIGTERM);
  EXPECT_EQ(again.wait_exit(60s), 0) << again.log();
}

TEST(NodeProcess, GarbageOnThePortThenSigtermLeavesCleanly) {
  TempDir d;
  Proc p(bootstrap_args(d, "n0"));
  const auto addr = listen_address(p);
  ASSERT_FALSE(addr.empty()) << p.log();
  ASSERT_TRUE(p.expect(std::regex(R"(round +1 )"), 60s)) << p.log();
  // Random bytes on the node's port, from a few connections.
  std::mt19937 rng(7);
  for (int c = 0; c < 5; ++c) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1))));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    std::vector<char> junk(4096 * (c + 1));
    for (auto& b : junk) b = static_cast<char>(rng());
    (void)!write(fd, junk.data(), junk.size());
    close(fd);
  }
  // Still training.
  ASSERT_TRUE(p.expect(std::regex(R"(round +4 )"), 60s)) << p.log();
  p.signal(SIGTERM);
  ASSERT_TRUE(p.expect(kStopped, 60s)) << p.log();
  EXPECT_EQ(p.wait_exit(30s), 0) << p.log();
  EXPECT_TRUE(fs::exists(d.path / "n0" / "checkpoint.bin"));
}

// Closed by default: the bootstrap node makes a key and prints the join command that carries
// it; a node without the key is refused (and told why), one with it joins and keeps it; --open
// makes a public swarm, and says so.
TEST(NodeProcess, ANodeWithoutTheSwarmKeyIsRefused) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0", {}, false));
  const auto addr = listen_address(n0);
  ASSERT_FALSE(addr.empty()) << n0.log();
  std::smatch m;
  ASSERT_TRUE(
      n0.expect(std::regex("join with: grove-node --peer \\S+ --swarm-key ([0-9a-f]{64})"), 5s, &m))
      << n0.log();
  const std::string key = m[1];
  Proc stranger({"--peer", addr, "--listen", "127.0.0.1:0", "--state-dir", d / "n1"});
  ASSERT_TRUE(stranger.expect(std::regex("could not reach any --peer .*join it with the "
                                         "--swarm-key its bootstrap printed"),
                              60s))
      << stranger.log();
  EXPECT_EQ(stranger.wait_exit(30s), 1);
  // With the key it joins, and its state dir keeps the key for a restart.
  Proc friend_({"--peer", addr, "--listen", "127.0.0.1:0", "--state-dir", d / "n2", "--swarm-key",
                key, "--max-steps", "40"});
  ASSERT_TRUE(friend_.expect(std::regex("synced +round"), 60s)) << friend_.log();
  EXPECT_EQ(friend_.wait_exit(60s), 0) << friend_.log();
  std::ifstream kept(d / "n2/swarm.key");
  std::string text;
  kept >> text;
  EXPECT_EQ(text, key);

  // An open swarm takes a node without a key.
  Proc pub(bootstrap_args(d, "p0", {"--open"}, false));
  ASSERT_TRUE(pub.expect(std::regex("an open swarm \\(--open\\)"), 30s)) << pub.log();
  const auto pub_addr = listen_address(pub);
  ASSERT_FALSE(pub_addr.empty()) << pub.log();
  Proc anyone({"--peer", pub_addr, "--listen", "127.0.0.1:0", "--state-dir", d / "p1",
               "--max-steps", "40"});
  ASSERT_TRUE(anyone.expect(std::regex("synced +round"), 60s)) << anyone.log();
  EXPECT_EQ(anyone.wait_exit(60s), 0) << anyone.log();
}

TEST(NodeProcess, StatusListsTheMembersAndARequestSwitchesTheSwarmToDiLoCo) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0"));
  const auto addr = listen_address(n0);
  ASSERT_FALSE(addr.empty()) << n0.log();
  Proc n1(join_args(d, "n1", addr));
  ASSERT_TRUE(n1.expect(std::regex("noloco with "), 60s)) << n1.log();
  {
    // From the member given with --peer: both members, reachable, in the same run (once the
    // member view of the node asked has taken in the joiner: asked again until then).
    const std::regex line(
        R"re("node":"([0-9a-f]{16})".*"status":"(training|averaging|checkpointing)".*"reachable":true)re");
    std::set<std::string> nodes;
    std::string log;
    for (const auto end = Clock::now() + 40s; nodes.size() < 2 && Clock::now() < end;) {
      Proc st({"status", "--json", "--peer", addr, "--swarm-key-file", d / "n0/swarm.key"});
      std::smatch m;
      nodes.clear();
      while (st.expect(line, 5s, &m)) nodes.insert(m[1]);
      EXPECT_EQ(st.wait_exit(20s), 0) << st.log();
      log = st.log();
    }
    EXPECT_EQ(nodes.size(), 2u) << log;
  }
  {
    // From the local node, found through its state dir: a table.
    Proc st({"status", "--state-dir", d / "n1"});
    ASSERT_TRUE(st.expect(std::regex("^node +status +step"), 20s)) << st.log();
    EXPECT_EQ(st.wait_exit(20s), 0) << st.log();
  }
  Proc req({"request", "diloco", "--peer", addr, "--swarm-key-file", d / "n0/swarm.key"});
  ASSERT_TRUE(req.expect(std::regex("switches to diloco from round [0-9]+"), 30s)) << req.log();
  EXPECT_EQ(req.wait_exit(20s), 0) << req.log();
  // The switch reaches both members: their rounds from then on are DiLoCo rounds.
  ASSERT_TRUE(n0.expect(std::regex("diloco (with|local-only|state sync)"), 90s)) << n0.log();
  ASSERT_TRUE(n1.expect(std::regex("diloco (with|local-only|state sync)"), 90s)) << n1.log();
  n0.signal(SIGTERM);
  n1.signal(SIGTERM);
  EXPECT_EQ(n0.wait_exit(60s), 0) << n0.log();
  EXPECT_EQ(n1.wait_exit(60s), 0) << n1.log();
  // Without a node to ask, status says so and fails.
  Proc none({"status", "--state-dir", d / "nobody"});
  ASSERT_TRUE(none.expect(std::regex("no local node found"), 10s)) << none.log();
  EXPECT_EQ(none.wait_exit(10s), 1);
}

// A node that joins a swarm already trained for a while takes the swarm's state: its first
// evaluated loss is the swarm's, not a fresh model's.
TEST(NodeProcess, AJoinerMidRunStartsNearTheSwarmsLoss) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0"));
  std::string addr;
  double fresh = 0;
  ASSERT_TRUE(started(n0, addr, fresh)) << n0.log();
  std::smatch m;
  Proc n1(join_args(d, "n1", addr));
  ASSERT_TRUE(n1.expect(std::regex("noloco with "), 60s)) << n1.log();
  ASSERT_TRUE(n0.expect(std::regex(R"(round +1[0-9] .* eval ([0-9.e-]+))"), 90s, &m)) << n0.log();
  const double swarm = std::stod(m[1]);
  ASSERT_LT(swarm, 0.7 * fresh) << n0.log();  // the swarm has learned something
  Proc n2(join_args(d, "n2", addr));
  ASSERT_TRUE(n2.expect(std::regex(R"(synced +round (\d+) from the swarm: eval loss ([0-9.e-]+))"),
                        60s, &m))
      << n2.log();
  EXPECT_GE(std::stoi(m[1]), 10);
  const double joined = std::stod(m[2]);
  std::printf("eval loss: fresh model %.4f, swarm at round 1x %.4f, joiner after sync %.4f\n",
              fresh, swarm, joined);
  EXPECT_LT(std::abs(joined - swarm), 0.25 * (fresh - swarm))
      << "fresh " << fresh << ", swarm " << swarm << ", joiner " << joined << "\n"
      << n2.log();
  ASSERT_TRUE(n2.expect(std::regex("noloco with "), 60s)) << n2.log();
  for (Proc* p : {&n0, &n1, &n2}) p->signal(SIGTERM);
  for (Proc* p : {&n0, &n1, &n2}) EXPECT_EQ(p->wait_exit(60s), 0) << p->log();
}

// Links slow enough (every node's sends shaped to 200 kbit/s with 100 ms of RTT) that a round —
// the state sync of a joiner, the pair or trio exchange of the small mlp's 21k parameters — lasts
// many times the inner phase: every node keeps training and averaging to its last step, no
// deadline fires and nobody leaves early.
TEST(NodeProcess, OverSlowLinksRoundsLastFarLongerThanTheInnerPhaseAndEveryNodeKeepsAveraging) {
  TempDir d;
  const std::vector<std::string> slow = {"--emulate-link", "200kbit,100ms", "--no-progress"};
  std::vector<std::string> a = {
      "--bootstrap", "--workload",  "mlp",    "--model-size", "small",       "--inner-steps",
      "20",          "--lr",        "0.01",   "--window-ms",  "1000",        "--listen",
      "127.0.0.1:0", "--state-dir", d / "n0", "--metrics",    d / "m0.jsonl"};
  a.insert(a.end(), slow.begin(), slow.end());
  Proc n0(a);
  const auto addr = listen_address(n0);
  ASSERT_FALSE(addr.empty()) << n0.log();
  std::vector<std::unique_ptr<Proc>> joiners;
  for (int i = 1; i <= 2; ++i) {
    auto j = join_args(d, "n" + std::to_string(i), addr,
                       {"--metrics", d / ("m" + std::to_string(i) + ".jsonl")});
    j.insert(j.end(), slow.begin(), slow.end());
    // Past the steps the bootstrap node trained alone while they fetched its state.
    j.insert(j.end(), {"--max-steps", "240"});
    joiners.push_back(std::make_unique<Proc>(j));
  }
  std::smatch m;
  const std::regex deadline(
      "timed out|not answered by its deadline|did not finish in|gave up waiting|past the chunk "
      "timeout|could not get the swarm's state");
  for (auto& j : joiners) {
    ASSERT_TRUE(j->expect(kStopped, 300s, &m)) << j->log();
    EXPECT_EQ(m[1], "240") << j->log();
  }
  n0.signal(SIGTERM);
  for (Proc* p : {&n0, joiners[0].get(), joiners[1].get()}) {
    EXPECT_EQ(p->wait_exit(60s), 0) << p->log();
    EXPECT_FALSE(std::regex_search(p->log(), deadline)) << p->log();
  }
  for (int i = 0; i < 3; ++i) {
    std::ifstream metrics(d / ("m" + std::to_string(i) + ".jsonl"));
    std::string rounds;  // one letter a round: 'a' averaged, 'l' local only
    double utilization = 1, wall = 0;
    for (std::string line; std::getline(metrics, line);) {
      if (line.find("\"event\":\"round\"") != std::string::npos)
        rounds += line.find("\"partners\":[\"") != std::string::npos ? 'a' : 'l';
      std::smatch e;
      if (line.find("\"event\":\"stop\"") != std::string::npos) {
        if (std::regex_search(line, e, std::regex(R"re("utilization":([0-9.e-]+))re")))
          utilization = std::stod(e[1]);
        if (std::regex_search(line, e, std::regex(R"re("wall_s":([0-9.e-]+))re")))
          wall = std::stod(e[1]);
      }
    }
    // The rounds while partners were there: from the first averaged one to the last.
    const auto first = rounds.find('a'), last = rounds.rfind('a');
    ASSERT_NE(first, std::string::npos) << "node " << i << " never averaged";
    const std::string together = rounds.substr(first, last - first + 1);
    const auto averaged = std::count(together.begin(), together.end(), 'a');
    std::printf("node %d: rounds %s, %.1f s, %.3f of it in inner steps\n", i, rounds.c_str(), wall,
                utilization);
    // The premise: a round (its exchange and waits) takes more than three inner phases.
    EXPECT_LT(utilization, 0.25) << "node " << i;
    EXPECT_GE(averaged, 5) << "node " << i << ": " << rounds;
    // At most one round missed its partners while they were there.
    EXPECT_GE(averaged + 1, static_cast<long>(together.size())) << "node " << i << ": " << rounds;
  }
}

// DiLoCo from the start: three members all-reduce every round and learn; one is killed with
// SIGKILL (mid-round, wherever it is) and the other two go on averaging with each other.
TEST(NodeProcess, DiLoCoSwarmTrainsAndGoesOnWhenAMemberIsKilled) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0", {"--outer", "diloco"}));
  std::string addr;
  double fresh = 0;
  ASSERT_TRUE(started(n0, addr, fresh)) << n0.log();
  std::smatch m;
  Proc n1(join_args(d, "n1", addr));
  Proc n2(join_args(d, "n2", addr));
  // A round of all three (the line names one partner "+1").
  if (!n1.expect(std::regex(R"(diloco with [0-9a-f]{8} \+1,)"), 90s)) {
    // Read what the others printed meanwhile (nothing matches), so that the failure shows it.
    n0.expect(std::regex("^$never^"), 2s);
    n2.expect(std::regex("^$never^"), 2s);
    FAIL() << n1.log() << "\n---- n0\n" << n0.log() << "\n---- n2\n" << n2.log();
  }
  ASSERT_TRUE(n2.expect(std::regex("diloco with "), 60s)) << n2.log();
  n2.kill9();
  // The survivors go on: rounds averaged between the two of them (no "+1"), the loss dropping.
  for (Proc* p : {&n0, &n1}) {
    const std::regex pair(R"(eval ([0-9.e-]+) .* diloco with [0-9a-f]{8},)");
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(p->expect(pair, 90s, &m)) << p->log();
    EXPECT_LT(std::stod(m[1]), 0.5 * fresh) << p->log();
    std::printf("survivor: eval loss %s after the kill (fresh model %.4f)\n", m[1].str().c_str(),
                fresh);
  }
  for (Proc* p : {&n0, &n1}) p->signal(SIGTERM);
  for (Proc* p : {&n0, &n1}) EXPECT_EQ(p->wait_exit(60s), 0) << p->log();
}

// The slow-weights hash each node's metrics give for the rounds it averaged (round → hash).
std::map<std::string, std::string> averaged_hashes(const std::string& metrics) {
  std::map<std::string, std::string> out;
  std::ifstream in(metrics);
  const std::regex round(
      R"re("event":"round".*"round":(\d+).*"partners":\[".*"param_hash":"([0-9a-f]+)")re");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, round)) out[m[1]] = m[2];
  }
  return out;
}

// Compressed DiLoCo-mode rounds (SparseLoCo's top-k of an error buffer, 2-bit top-k, E3M0
// DiLoCo), streaming fragments (DiLoCo's and SparseLoCo's rounds of a quarter of the model) and
// NoLoCo's compressed pairs (a pair averages a quarter of the model a round), from the start:
// three members average and learn; one is killed with SIGKILL and a fourth joins; the survivors
// and the joiner average together, and (groups) every round that two members averaged ended with
// the same slow weights on both.
class CompressedProcess : public ::testing::TestWithParam<const char*> {};

TEST_P(CompressedProcess, LearnsThroughAKillAndAJoinWithOnePhiPerRound) {
  TempDir d;
  std::vector<std::string> algo;
  const std::string which = GetParam();
  if (which == "e3m0")
    algo = {"--outer", "diloco", "--codec", "e3m0"};
  else if (which == "diloco-fragments")  // with overlap: each round's φ mixed into its fragment
    algo = {"--outer", "diloco", "--overlap"};
  else if (which == "noloco-fragments")  // compressed pairs: a pair averages a quarter a round
    algo = {"--outer", "noloco"};
  else
    algo = {"--outer",      "sparseloco", "--topk",      "8",
            "--topk-chunk", "64",         "--topk-bits", which == "sparseloco-2bit" ? "2" : "32"};
  // Streaming fragments: a round every 5 steps, a quarter of the model each.
  if (which.ends_with("-fragments")) algo.insert(algo.end(), {"--fragments", "4"});
  const std::string mode = which == "noloco-fragments"                      ? "noloco"
                           : which == "e3m0" || which == "diloco-fragments" ? "diloco"
                                                                            : "sparseloco";
  auto extra = algo;
  extra.insert(extra.end(), {"--metrics", d / "m0.jsonl"});
  Proc n0(bootstrap_args(d, "n0", extra));
  std::string addr;
  double fresh = 0;
  ASSERT_TRUE(started(n0, addr, fresh)) << n0.log();
  Proc n1(join_args(d, "n1", addr, {"--metrics", d / "m1.jsonl"}));
  Proc n2(join_args(d, "n2", addr));
  if (!n1.expect(std::regex(mode + R"( with [0-9a-f]{8} \+1,)"), 90s)) {
    n0.expect(std::regex("^$never^"), 2s);
    n2.expect(std::regex("^$never^"), 2s);
    FAIL() << n1.log() << "\n---- n0\n" << n0.log() << "\n---- n2\n" << n2.log();
  }
  n2.kill9();
  Proc n3(join_args(d, "n3", addr, {"--metrics", d / "m3.jsonl"}));
  ASSERT_TRUE(n3.expect(std::regex("synced +round"), 60s)) << n3.log();
  std::smatch m;
  const std::regex averaged(R"(eval ([0-9.e-]+) .* )" + mode + R"( with [0-9a-f]{8})");
  // (Three rounds' steps: with fragments, four times as many rounds of a quarter each.)
  const int rounds = which.ends_with("-fragments") ? 12 : 3;
  for (Proc* p : {&n3, &n0, &n1}) {
    for (int i = 0; i < rounds; ++i) ASSERT_TRUE(p->expect(averaged, 90s, &m)) << p->log();
    EXPECT_LT(std::stod(m[1]), 0.5 * fresh) << p->log();
  }
  for (Proc* p : {&n0, &n1, &n3}) p->signal(SIGTERM);
  for (Proc* p : {&n0, &n1, &n3}) EXPECT_EQ(p->wait_exit(60s), 0) << p->log();
  if (mode == "noloco") {  // (pairs: every member's φ its own)
    EXPECT_NE(n0.log().find("1/4 of the model a round"), std::string::npos) << n0.log();
    std::printf("%s: eval loss %s (fresh %.4f)\n", which.c_str(), m[1].str().c_str(), fresh);
    return;
  }
  const auto h0 = averaged_hashes(d / "m0.jsonl");
  std::size_t compared = 0;
  for (const char* other : {"m1.jsonl", "m3.jsonl"})
    for (const auto& [round, hash] : averaged_hashes(d / other))
      if (auto it = h0.find(round); it != h0.end()) {
        EXPECT_EQ(hash, it->second) << other << " round " << round;
        ++compared;
      }
  EXPECT_GE(compared, 4u);
  std::printf("%s: %zu rounds compared across members, one φ each; eval loss %s (fresh %.4f)\n",
              which.c_str(), compared, m[1].str().c_str(), fresh);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, CompressedProcess,
                         ::testing::Values("sparseloco", "sparseloco-2bit", "e3m0",
                                           "diloco-fragments", "sparseloco-fragments",
                                           "noloco-fragments"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A node that cannot be dialed (its advertised address leads to a closed port, as behind a NAT
// without a port forward) learns so from its peers' dial-back checks, advertises no address,
// and still averages with the swarm over the connections it opens (it syncs its state from the
// reachable members when it joins). `mode` is noloco or diloco.
void unreachable_node_takes_part(const std::string& mode) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0", {"--outer", mode}));
  std::string addr;
  double fresh = 0;
  ASSERT_TRUE(started(n0, addr, fresh)) << n0.log();
  Proc n1(join_args(d, "n1", addr));
  ASSERT_TRUE(n1.expect(std::regex(R"(reach: reachable at 127\.0\.0\.1:\d+ \(1 peer)"), 30s))
      << n1.log();
  Proc n2(
      join_args(d, "n2", addr,
                {"--advertise", "127.0.0.1:1", "--max-steps", "400", "--metrics", d / "m2.jsonl"}));
  ASSERT_TRUE(
      n2.expect(std::regex(R"(reach: 2 peer\(s\) could not dial us at 127\.0\.0\.1:1)"), 30s))
      << n2.log();
  std::smatch m;
  ASSERT_TRUE(n2.expect(kStopped, 180s, &m)) << n2.log();
  EXPECT_LT(std::stod(m[3]), 0.5 * fresh) << n2.log();
  EXPECT_EQ(n2.wait_exit(30s), 0) << n2.log();
  std::ifstream metrics(d / "m2.jsonl");
  int rounds = 0, averaged = 0;
  for (std::string line; std::getline(metrics, line);) {
    if (line.find("\"event\":\"round\"") == std::string::npos) continue;
    ++rounds;
    averaged += line.find("\"partners\":[\"") != std::string::npos;
  }
  std::printf("%s: the node nobody can dial averaged %d of its %d rounds\n", mode.c_str(), averaged,
              rounds);
  EXPECT_GE(rounds, 15);
  EXPECT_GE(averaged * 10, rounds * 7) << n2.log();
  for (Proc* p : {&n0, &n1}) p->signal(SIGTERM);
  for (Proc* p : {&n0, &n1}) EXPECT_EQ(p->wait_exit(60s), 0) << p->log();
}

TEST(NodeProcess, ANodeNobodyCanDialStillAveragesNoLoCo) {
  unreachable_node_takes_part("noloco");
}

TEST(NodeProcess, ANodeNobodyCanDialStillAveragesDiLoCo) {
  unreachable_node_takes_part("diloco");
}

// Two nodes that nobody can dial and one that everybody can: the two reserve a relay at the
// reachable one, advertise "relay:..." addresses, and when matchmaking puts them together they
// exchange through it (end to end encrypted); all three keep averaging.
TEST(NodeProcess, TwoUndialableNodesAverageThroughARelay) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0"));
  std::string addr;
  double fresh = 0;
  ASSERT_TRUE(started(n0, addr, fresh)) << n0.log();
  std::vector<std::unique_ptr<Proc>> hidden;
  for (int i = 1; i <= 2; ++i)
    hidden.push_back(std::make_unique<Proc>(join_args(
        d, "n" + std::to_string(i), addr,
        {"--advertise", "127.0.0.1:" + std::to_string(i), "--max-steps", "400", "--metrics",
         d / ("m" + std::to_string(i) + ".jsonl"), "--log-level", "debug"})));
  for (auto& p : hidden)
    ASSERT_TRUE(p->expect(std::regex(R"(reach: reachable through 1 relay\(s\): relay:)"), 60s))
        << p->log();
  std::smatch m;
  for (auto& p : hidden) {
    ASSERT_TRUE(p->expect(kStopped, 180s, &m)) << p->log();
    EXPECT_LT(std::stod(m[3]), 0.5 * fresh) << p->log();
    EXPECT_EQ(p->wait_exit(30s), 0) << p->log();
  }
  // Rounds of the two hidden nodes, and those they averaged with each other (through n0).
  int rounds = 0, averaged = 0, together = 0;
  std::set<std::string> ids;
  for (int i = 1; i <= 2; ++i) {
    std::ifstream f(d / ("m" + std::to_string(i) + ".jsonl"));
    for (std::string line; std::getline(f, line);) {
      std::smatch e;
      if (std::regex_search(line, e, std::regex(R"re("node":"([0-9a-f]+)")re"))) ids.insert(e[1]);
      if (line.find("\"event\":\"round\"") == std::string::npos) continue;
      ++rounds;
      averaged += line.find("\"partners\":[\"") != std::string::npos;
    }
  }
  ASSERT_EQ(ids.size(), 2u);
  for (int i = 1; i <= 2; ++i) {
    std::ifstream f(d / ("m" + std::to_string(i) + ".jsonl"));
    for (std::string line; std::getline(f, line);) {
      if (line.find("\"event\":\"round\"") == std::string::npos) continue;
      for (const auto& id : ids)
        if (line.find("\"node\":\"" + id) == std::string::npos &&
            line.find("\"" + id.substr(0, 8)) != std::string::npos)
          ++together;
    }
  }
  std::printf("two undialable nodes: %d rounds, %d averaged, %d with each other (via the relay)\n",
              rounds, averaged, together);
  EXPECT_GE(averaged * 10, rounds * 7);
  EXPECT_GE(together, 4) << hidden[0]->log();
  n0.signal(SIGTERM);
  EXPECT_EQ(n0.wait_exit(60s), 0) << n0.log();
}

// With --overlap the nodes train on while they average and checkpoint in the background; they
// still learn together, leave cleanly and leave a checkpoint that a restart resumes from.
TEST(NodeProcess, OverlapTrainsTogetherAndCheckpointsInTheBackground) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0", {"--overlap"}));
  std::string addr;
  double fresh = 0;
  ASSERT_TRUE(started(n0, addr, fresh)) << n0.log();
  std::smatch m;
  Proc n1(join_args(d, "n1", addr, {"--overlap"}));
  const std::regex averaged(R"(round +(\d+) .* eval ([0-9.e-]+) .* noloco with )");
  for (Proc* p : {&n0, &n1})
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(p->expect(averaged, 60s, &m)) << p->log();
  EXPECT_LT(std::stod(m[2]), 0.5 * fresh) << n1.log();
  for (Proc* p : {&n0, &n1}) p->signal(SIGTERM);
  for (Proc* p : {&n0, &n1}) EXPECT_EQ(p->wait_exit(60s), 0) << p->log();
  Proc again({"--listen", "127.0.0.1:0", "--state-dir", d / "n1", "--max-steps", "1"});
  ASSERT_TRUE(again.expect(std::regex(R"(resumed +round (\d+))"), 60s, &m)) << again.log();
  EXPECT_GE(std::stoi(m[1]), 5);
  EXPECT_EQ(again.wait_exit(60s), 0) << again.log();
}

// DeMo (outer demo) on the built-in mlp: a joiner takes the group's θ at its first call with it,
// every call after leaves both members with the same bits (their hash lines of the same call
// agree), and the swarm learns.
TEST(NodeProcess, DeMoKeepsOneThetaOnEveryMemberAndLearns) {
  TempDir d;
  Proc n0(bootstrap_args(d, "n0", {"--outer", "demo"}));
  std::string addr;
  double fresh = 0;
  ASSERT_TRUE(started(n0, addr, fresh)) << n0.log();
  // It steps alone first (a per-step run prints no round lines: its θ hash lines tell).
  ASSERT_TRUE(n0.expect(std::regex(R"(demo: call 1000: θ [0-9a-f]+ \(1 members\))"), 60s))
      << n0.log();
  Proc n1(join_args(d, "n1", addr, {"--max-steps", "5000"}));
  ASSERT_TRUE(n1.expect(std::regex("demo: θ aligned with the group \\(2 members\\)"), 60s))
      << n1.log();
  const std::regex hash(R"(demo: call (\d+): θ ([0-9a-f]+) \(2 members\))");
  std::map<std::string, std::string> h0, h1;
  std::smatch m;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(n1.expect(hash, 60s, &m)) << n1.log();
    h1[m[1]] = m[2];
    ASSERT_TRUE(n0.expect(hash, 60s, &m)) << n0.log();
    h0[m[1]] = m[2];
  }
  // (Each member's first hash lines with two members may be of different calls, when one printed
  // a line before the other's first: the calls both printed are compared.)
  int common = 0;
  for (const auto& [call, theta] : h1)
    if (auto it = h0.find(call); it != h0.end()) {
      ++common;
      EXPECT_EQ(it->second, theta) << "the members' θ differ after call " << call;
    }
  EXPECT_GE(common, 2) << n0.log() << n1.log();
  ASSERT_TRUE(n1.expect(kStopped, 120s, &m)) << n1.log();
  EXPECT_LT(std::stod(m[3]), 0.7 * fresh) << n1.log();
  EXPECT_EQ(n1.wait_exit(30s), 0) << n1.log();
  // Alone again, n0 goes on stepping (its calls are a group of one) until it is stopped.
  n0.signal(SIGTERM);
  EXPECT_EQ(n0.wait_exit(60s), 0) << n0.log();
}

TEST(NodeProcess, BadArgumentsExitTwoWithAMessage) {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--inner-steps", "20"},
                                                                {"--bootstrap", "--lr", "fast"},
                                                                {"--peer", "nohost"},
                                                                {"--frobnicate"}}) {
    Proc p(args);
    ASSERT_TRUE(p.expect(std::regex("grove-node: .*"), 10s)) << p.log();
    EXPECT_EQ(p.wait_exit(10s), 2) << p.log();
  }
  Proc h({"--help"});
  ASSERT_TRUE(h.expect(std::regex("Usage:"), 10s));
  EXPECT_EQ(h.wait_exit(10s), 0);
}

}  // namespace

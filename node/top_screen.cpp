// run_top (top.hpp): TopModel on the terminal with ncurses. A thread asks the node for the
// swarm's status once a second (each answer within 3 s); the screen thread draws the latest and
// reads the keys (q quits, up/down or k/j select, s/S sort by the next/previous column, r
// reverses, Ctrl-C quits too). When stdout is not a terminal: two answers a second apart (so
// that the byte rates are known), printed once as a table.
#include <curses.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "node/status_client.hpp"
#include "node/top.hpp"

namespace grove::node {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kEvery = std::chrono::seconds(1);
constexpr auto kAnswerWithin = std::chrono::seconds(3);

std::atomic<bool> g_interrupted{false};

// The fetching thread: the latest answer (or failure) for the screen to take.
class Fetcher {
 public:
  Fetcher(StatusClient& client, std::string target)
      : client_(client), target_(std::move(target)), thread_([this] { run(); }) {}
  ~Fetcher() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::optional<transport::Result<std::vector<MemberStatus>>> take() {
    std::lock_guard lk(mu_);
    return std::exchange(latest_, std::nullopt);
  }

 private:
  void run() {
    for (;;) {
      const auto next = Clock::now() + kEvery;
      auto r = client_.swarm_status(target_, kAnswerWithin);
      std::unique_lock lk(mu_);
      latest_ = std::move(r);
      if (cv_.wait_until(lk, next, [&] { return stop_; })) return;
    }
  }
  StatusClient& client_;
  const std::string target_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<transport::Result<std::vector<MemberStatus>>> latest_;
  std::thread thread_;  // (last: started once the members above exist)
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int plain(StatusClient& client, const std::string& target) {
  TopModel model;
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) {
    if (i > 0) std::this_thread::sleep_until(t0 + kEvery);  // the rates' second
    auto r = client.swarm_status(target, kAnswerWithin);
    if (!r) {
      std::fprintf(stderr, "grove-node: no status from %s: %s\n", target.c_str(), r.text().c_str());
      return 1;
    }
    model.update(*r, seconds_since(t0));
  }
  std::fputs(model.table().c_str(), stdout);
  return 0;
}

// ncurses set up and torn down whatever way the loop ends.
struct Screen {
  Screen() {
    initscr();
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    timeout(100);  // getch waits at most this long: answers are drawn as they come
  }
  ~Screen() { endwin(); }
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;
};

}  // namespace

int run_top(StatusClient& client, const std::string& target) {
  if (!::isatty(STDOUT_FILENO)) return plain(client, target);
  g_interrupted = false;
  auto on_signal = [](int) { g_interrupted = true; };
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  TopModel model;
  const auto t0 = Clock::now();
  Fetcher fetcher(client, target);
  Screen screen;
  bool dirty = true;
  while (!g_interrupted) {
    if (auto r = fetcher.take()) {
      if (*r)
        model.update(**r, seconds_since(t0));
      else
        model.failed("no answer: " + r->text());
      dirty = true;
    }
    if (dirty) {
      int highlight = -1;
      const auto lines =
          model.screen(static_cast<std::size_t>(std::max(COLS, 1)),
                       static_cast<std::size_t>(std::max(LINES, 1)), target, highlight);
      erase();
      for (std::size_t i = 0; i < lines.size(); ++i) {
        const bool hl = static_cast<int>(i) == highlight;
        if (hl) attron(A_REVERSE);
        mvaddnstr(static_cast<int>(i), 0, lines[i].c_str(), COLS);
        if (hl) attroff(A_REVERSE);
      }
      refresh();
      dirty = false;
    }
    const int k = getch();
    switch (k) {
      case ERR:
        break;
      case 'q':
      case 'Q':
        return 0;
      case KEY_UP:
      case 'k':
        model.select(-1);
        dirty = true;
        break;
      case KEY_DOWN:
      case 'j':
        model.select(1);
        dirty = true;
        break;
      case KEY_PPAGE:
        model.select(-10);
        dirty = true;
        break;
      case KEY_NPAGE:
        model.select(10);
        dirty = true;
        break;
      case 's':
        model.sort_next(1);
        dirty = true;
        break;
      case 'S':
        model.sort_next(-1);
        dirty = true;
        break;
      case 'r':
        model.reverse();
        dirty = true;
        break;
      default:  // KEY_RESIZE and the rest: draw again
        dirty = true;
        break;
    }
  }
  return 0;
}

}  // namespace grove::node

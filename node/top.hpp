// `grove-node top`: a live dashboard of the whole swarm. TopModel is what the screen shows, made
// from successive "swarm_status" answers (node/status.hpp) and nothing else: per member its
// state, step, round, losses against the floor, tokens/s, last sync, bytes in and out per second
// (from the answers' byte counters), the members that went away (kept a minute as "gone"), and
// the swarm's mean loss and sync time over the last answers (sparklines); sorting and the
// selected row; rendered to lines of printable ASCII (a peer's strings never reach the terminal
// as they came). Pure: no terminal, no clock, no network. top_screen.cpp draws it with ncurses
// and reads the keys (run_top).
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "node/status.hpp"

namespace grove::node {

class StatusClient;

struct TopRow {
  MemberStatus m;              ///< as last listed
  std::string state;           ///< training, syncing, joining 42%, checkpointing, gone, ...
  double in_bps = NAN;         ///< bytes received a second, over the last answers (~5 s)
  double out_bps = NAN;        ///< bytes sent a second
  double last_round_mb = NAN;  ///< MB in and out between its last two round changes
  bool gone = false;           ///< not in the last answer (listed a minute more)
};

class TopModel {
 public:
  enum class Sort { node, state, step, round, loss, eval, tokens, sync, in, out, address };
  static constexpr std::size_t kSorts = 11;
  static constexpr std::size_t kHistory = 240;  ///< sparkline samples kept
  static constexpr double kGoneFor = 60;        ///< seconds a member that went away stays listed

  /// An answer listing `members`, received at `now` (seconds, any steady origin).
  void update(const std::vector<MemberStatus>& members, double now);
  /// A fetch that failed (shown in the header until the next answer).
  void failed(std::string why) { error_ = std::move(why); }

  /// Sorts by the next (`step` = 1) or previous (-1) column; reverse() flips the order.
  void sort_next(int step);
  void reverse() {
    descending_ = !descending_;
    rebuild();
  }
  /// Moves the selection by `delta` rows (clamped).
  void select(int delta);
  Sort sort() const { return sort_; }
  static const char* sort_name(Sort s);

  /// The rows in display order.
  const std::vector<TopRow>& rows() const { return rows_; }
  /// The selected row's index in rows(), if any.
  std::optional<std::size_t> selected() const;
  /// The screen: at most `height` lines of at most `width` characters; `highlight` is set to the
  /// line of the selected row (none: -1). `target`: the node asked.
  std::vector<std::string> screen(std::size_t width, std::size_t height, const std::string& target,
                                  int& highlight) const;
  /// The members as a plain table (the output is not a terminal).
  std::string table() const;
  const std::deque<double>& loss_history() const { return loss_; }
  const std::deque<double>& sync_history() const { return sync_; }

 private:
  struct Seen {
    std::deque<std::pair<double, MemberStatus>> samples;  // (time, status), the last ~5 s
    std::uint64_t round = 0;
    std::uint64_t bytes_at_round = 0;  // sent + received when its round last changed
    bool round_known = false;
    double last_round_mb = NAN;
    bool gone = false;
    double gone_since = 0;
  };
  void rebuild();
  std::string header_line() const;
  std::string row_line(const TopRow& r) const;

  std::map<std::string, Seen> seen_;  // by node id
  std::vector<TopRow> rows_;
  std::deque<double> loss_, sync_;
  Sort sort_ = Sort::node;
  bool descending_ = false;
  std::string selected_;  // node id
  std::string error_;
};

/// A sparkline of `v` in `width` characters of " .:-=+*#" (low to high, scaled to the values'
/// range; the newest at the right; NaN as ' ').
std::string sparkline(const std::deque<double>& v, std::size_t width);

/// The dashboard on this terminal until q (or a plain table once, when stdout is not a
/// terminal). Returns the exit status.
int run_top(StatusClient& client, const std::string& target);

}  // namespace grove::node

// Command-line parsing shared by the benchmark programs. Args walks argv one argument at a time
// and reads typed values with range checks; a bad argument prints "<program>: <why>" and the
// usage to stderr and exits with status 2, -h or --help prints the usage to stdout and exits
// with 0. parse_size reads counts with binary suffixes ("64K", "8M", "2G"); split cuts lists.
#pragma once

#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace grove::bench {

/// Parses "123", "64K", "8M", "2G", "1T" (binary multiples, case-insensitive, optional "iB"/"B").
inline std::optional<std::uint64_t> parse_size(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  std::size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    if (v > (~std::uint64_t{0} - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(s[i] - '0');
  }
  if (i == 0) return std::nullopt;
  std::string rest(s.substr(i));
  for (auto& c : rest) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift = 0;
  if (rest.empty() || rest == "b") {
    shift = 0;
  } else if (rest == "k" || rest == "kib" || rest == "kb") {
    shift = 10;
  } else if (rest == "m" || rest == "mib" || rest == "mb") {
    shift = 20;
  } else if (rest == "g" || rest == "gib" || rest == "gb") {
    shift = 30;
  } else if (rest == "t" || rest == "tib" || rest == "tb") {
    shift = 40;
  } else {
    return std::nullopt;
  }
  if (shift && v > (~std::uint64_t{0} >> shift)) return std::nullopt;
  return v << shift;
}

/// The items of `s` between `sep`s, empty ones dropped.
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

/// The arguments of a benchmark program, read in order:
///
///   Args args(argc, argv, "[--reps N] [--codec fp16|bf16]");
///   while (args.next()) {
///     if (args.is("--reps")) reps = args.number(1, 100);
///     else if (args.is("--codec")) codec = args.choice({"fp16", "bf16"});
///     else args.unknown();
///   }
///
/// Every reader of a value fails (message, usage, exit status 2) when the value is missing, does
/// not parse or is out of range; fail() does the same for checks of the program's own.
class Args {
 public:
  static constexpr std::uint64_t kMaxSize = std::numeric_limits<std::uint64_t>::max();

  /// `synopsis` follows "usage: <argv[0]> " (it may span lines); `details`, when not empty, is
  /// printed on the lines after it (one line per option, say).
  Args(int argc, char** argv, std::string synopsis, std::string details = {})
      : argc_(argc), argv_(argv), synopsis_(std::move(synopsis)), details_(std::move(details)) {}

  /// Steps to the next argument; false when none is left. -h and --help print the usage and exit.
  bool next() {
    if (i_ + 1 >= argc_) return false;
    arg_ = argv_[++i_];
    if (arg_ == "-h" || arg_ == "--help") help();
    return true;
  }
  /// The argument next() stepped to: an option's name (or a positional argument).
  const std::string& arg() const { return arg_; }
  bool is(std::string_view name) const { return arg_ == name; }

  /// The next argument, which must be there, as a positional one; `what` names it in errors.
  std::string positional(const std::string& what) {
    if (!next()) fail("missing " + what);
    return arg_;
  }

  /// The current option's value: the argument after it, as it is.
  std::string value() {
    if (i_ + 1 >= argc_) fail(arg_ + " needs a value");
    return argv_[++i_];
  }
  /// A value that must be one of `choices`.
  std::string choice(std::initializer_list<std::string_view> choices) {
    const std::string v = value();
    std::string all;
    for (const std::string_view c : choices) {
      if (v == c) return v;
      all += (all.empty() ? "" : ", ") + std::string(c);
    }
    bad_value(v, "one of " + all);
  }
  /// A number in [lo, hi]: decimal digits for an integer T, a decimal real for a floating one.
  template <class T>
  T number(T lo = std::numeric_limits<T>::lowest(), T hi = std::numeric_limits<T>::max()) {
    return number_of(value(), lo, hi);
  }
  /// A count with an optional binary suffix (parse_size) in [lo, hi], a multiple of `multiple`.
  std::uint64_t size(std::uint64_t lo = 0, std::uint64_t hi = kMaxSize,
                     std::uint64_t multiple = 1) {
    return size_of(value(), lo, hi, multiple);
  }
  /// A comma-separated list (empty items are dropped).
  std::vector<std::string> list() { return split(value(), ','); }
  /// A comma-separated list of numbers, each as number() reads one.
  template <class T>
  std::vector<T> numbers(T lo = std::numeric_limits<T>::lowest(),
                         T hi = std::numeric_limits<T>::max()) {
    std::vector<T> out;
    for (const auto& s : list()) out.push_back(number_of(s, lo, hi));
    return out;
  }
  /// A comma-separated list of counts, each as size() reads one.
  std::vector<std::uint64_t> sizes(std::uint64_t lo = 0, std::uint64_t hi = kMaxSize,
                                   std::uint64_t multiple = 1) {
    std::vector<std::uint64_t> out;
    for (const auto& s : list()) out.push_back(size_of(s, lo, hi, multiple));
    return out;
  }

  /// Prints "<program>: <why>" and the usage to stderr and exits with status 2.
  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\n", program().c_str(), why.c_str());
    print_usage(stderr);
    std::exit(2);
  }
  /// fail() for a value `v` of the current option that is not `expected`.
  [[noreturn]] void bad_value(const std::string& v, const std::string& expected) const {
    fail("bad value '" + v + "' for " + arg_ + " (expected " + expected + ")");
  }
  /// fail() for an option the program does not know.
  [[noreturn]] void unknown() const { fail("unknown option " + arg_); }
  /// Prints the usage to stdout and exits with status 0.
  [[noreturn]] void help() const {
    print_usage(stdout);
    std::exit(0);
  }

 private:
  template <class T>
  T number_of(const std::string& s, T lo, T hi) const {
    static_assert(std::is_arithmetic_v<T>);
    T v{};
    const char* end = s.data() + s.size();
    const auto [p, ec] = std::from_chars(s.data(), end, v);
    if (s.empty() || ec != std::errc() || p != end || !(v >= lo && v <= hi)) {
      std::string what = std::is_integral_v<T> ? "a whole number" : "a number";
      if (lo != std::numeric_limits<T>::lowest() || hi != std::numeric_limits<T>::max())
        what += range(lo, hi);
      bad_value(s, what);
    }
    return v;
  }

  std::uint64_t size_of(const std::string& s, std::uint64_t lo, std::uint64_t hi,
                        std::uint64_t multiple) const {
    const auto v = parse_size(s);
    if (!v || *v < lo || *v > hi || *v % multiple != 0) {
      std::string what = "a count";
      if (lo != 0 || hi != kMaxSize) what += range(lo, hi);
      if (multiple != 1) what += ", a multiple of " + std::to_string(multiple);
      bad_value(s, what + "; K/M/G/T suffixes allowed");
    }
    return *v;
  }

  // " from LO to HI", " >= LO" or " <= HI".
  template <class T>
  static std::string range(T lo, T hi) {
    auto text = [](T x) {
      if constexpr (std::is_integral_v<T>) {
        return std::to_string(x);
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
        return std::string(buf);
      }
    };
    if (hi == std::numeric_limits<T>::max()) return " >= " + text(lo);
    if (lo == std::numeric_limits<T>::lowest()) return " <= " + text(hi);
    return " from " + text(lo) + " to " + text(hi);
  }

  std::string program() const {
    const std::string_view p = argc_ > 0 ? argv_[0] : "bench";
    return std::string(p.substr(p.rfind('/') + 1));
  }

  void print_usage(std::FILE* to) const {
    std::fprintf(to, "usage: %s %s\n", argc_ > 0 ? argv_[0] : "bench", synopsis_.c_str());
    if (!details_.empty())
      std::fprintf(to, "%s%s", details_.c_str(), details_.back() == '\n' ? "" : "\n");
  }

  int argc_;
  char** argv_;
  int i_ = 0;
  std::string arg_;
  std::string synopsis_, details_;
};

}  // namespace grove::bench

// Fuzz target for the run config parser (node/config.hpp): the "grove-run v1" text a joiner reads
// from the DHT record of a run (any member can publish one) and from its own checkpoint.
//
// Properties checked on every input (a violation traps, so libFuzzer records a crash):
//   - parse_run_config never crashes; a rejection says why;
//   - the size bound is honoured: nothing longer than kMaxConfigText is accepted;
//   - what it accepts is canonical: to_text() gives back the input's bytes, and parsing that text
//     again gives an equal config with the same run name (one config, one name);
//   - an accepted config passes check() and its run name is a valid run name;
//   - valid_run_name on the input (the DHT subkey a record is published under) never crashes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "node/config.hpp"

namespace {
using namespace grove::node;

void check(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)valid_run_name(text);

  auto c = parse_run_config(text);
  const std::string why = c.why();
  if (!c) {
    check(!why.empty());
    return 0;
  }
  check(size <= kMaxConfigText);
  check(c->check().empty());

  const std::string canonical = c->to_text();
  check(canonical == text);
  auto again = parse_run_config(canonical);
  check(again.has_value());
  check(*again == *c);
  const std::string name = c->run_name();
  check(again->run_name() == name);
  check(valid_run_name(name));
  check(name.rfind(to_string(c->workload), 0) == 0);
  return 0;
}

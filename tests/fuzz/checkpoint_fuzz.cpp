// Fuzz target for the checkpoint decoder (node/checkpoint.hpp): the bytes of a checkpoint file,
// which may be damaged, truncated or foreign, and which a restarting node loads before anything
// else.
//
// Each input is decoded three ways:
//   1. as a whole file (magic and BLAKE2b-256 checks);
//   2. as a file body, sealed by the harness with its BLAKE2b-256 (a fuzzer cannot forge the hash:
//      this reaches the section parser and optim::deserialize behind it);
//   3. as the outer state section (optim::serialize's form) without its checksum, which the
//      harness appends (state_checksum, and the byte-wise FNV-1a 64 of the older GRVOUT01 form):
//      this reaches the array parser behind that checksum.
// Properties checked (a violation traps, so libFuzzer records a crash):
//   - decode_checkpoint never crashes; a rejection says why;
//   - what it accepts is bounded by the file: encoding the decoded checkpoint again gives exactly
//     as many bytes as the file (every byte is in a section, every section exactly once, so the
//     decoded strings and arrays hold no more than the file did);
//   - encoding it and decoding that gives the same fields, and encoding is canonical (the second
//     encoding has the same bytes as the first);
//   - the file without its last byte is rejected (a truncated file never loads);
//   - with a small max_values it accepts exactly the checkpoints whose arrays fit, with the same
//     fields;
//   - an outer state that optim::deserialize accepts holds finite values only, and serialising it
//     gives back exactly its bytes (the form leaves no freedom; a GRVOUT01 state is written as
//     GRVOUT02 and reads back the same).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "node/checkpoint.hpp"
#include "optim/outer.hpp"
#include "transport/crypto.hpp"

namespace {
using namespace grove;
using namespace grove::node;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr std::size_t kSmallMaxValues = 16;

std::size_t largest_array(const optim::OuterState& o) {
  return std::max({o.phi.size(), o.momentum.size(), o.error.size()});
}

void fuzz_file(std::span<const std::uint8_t> file) {
  auto c = decode_checkpoint(file);
  const std::string why = c.why();

  auto small = decode_checkpoint(file, kSmallMaxValues);
  const std::string small_why = small.why();
  check(small.has_value() == (c.has_value() && largest_array(c->outer) <= kSmallMaxValues));
  if (small) check(*small == *c);

  if (!c) {
    check(!why.empty());
    return;
  }
  const auto bytes = encode_checkpoint(*c);
  check(bytes.size() == file.size());
  auto again = decode_checkpoint(bytes);
  check(again.has_value());
  check(*again == *c);
  check(encode_checkpoint(*again) == bytes);

  check(!decode_checkpoint(file.first(file.size() - 1)));
}

void append_u64(std::vector<std::uint8_t>& b, std::uint64_t h) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(h >> (8 * i)));
}
// GRVOUT01's checksum: FNV-1a 64 over everything before it, a byte at a time.
std::uint64_t fnv1a(std::span<const std::uint8_t> b) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::uint8_t c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

void fuzz_outer_state(std::span<const std::uint8_t> in) {
  for (const bool v1 : {false, true}) {
    std::vector<std::uint8_t> b(in.begin(), in.end());
    append_u64(b, v1 ? fnv1a(b) : optim::state_checksum(b));
    auto s = optim::deserialize(b);
    if (!s) continue;
    check(optim::all_finite(s->phi) && optim::all_finite(s->momentum) &&
          optim::all_finite(s->error));
    const auto again = optim::serialize(*s);
    if (!v1) check(again == b);
    auto back = optim::deserialize(again);
    check(back.has_value() && *back == *s);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> in(data, size);
  fuzz_file(in);

  std::vector<std::uint8_t> sealed(in.begin(), in.end());
  const auto h = transport::blake2b_256(in);
  sealed.insert(sealed.end(), h.begin(), h.end());
  fuzz_file(sealed);

  fuzz_outer_state(in);
  return 0;
}

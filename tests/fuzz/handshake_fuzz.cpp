// Fuzz target for the sans-IO handshake (transport/handshake.hpp): attacker-controlled bytes
// in every position a peer can put them. Nothing may crash, and no input may complete a
// handshake or yield keys, since every accepted message must be authenticated by a key pair
// the attacker does not have.
//
// Each input is used as:
//   1. M1 to a fresh responder;
//   2. M2 to a fresh initiator that has sent its M1;
//   3. two messages to a fresh responder: the first kM1Size bytes as M1 and the rest as M3
//      (a valid M1 seed followed by anything reaches responder_m3);
//   4. when it has the size of an M3: M3 to a responder that has accepted a real initiator's M1,
//      and then M2 to that initiator once it has been answered (both in their deepest states).
#include <cstddef>
#include <cstdint>
#include <span>

#include "transport/handshake.hpp"
#include "transport/identity.hpp"

namespace {
using namespace grove::transport;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const Identity& initiator_identity() {
  static const Identity id = Identity::generate();
  return id;
}
const Identity& responder_identity() {
  static const Identity id = Identity::generate();
  return id;
}

HandshakeConfig config(const Identity& self) {
  HandshakeConfig cfg;
  cfg.self = &self;
  return cfg;
}

// A step on attacker bytes may fail or, for M1 (unauthenticated by identity), succeed with an M2;
// it may never finish a handshake.
void check_not_done(const Result<Handshake::Step>& r, const Handshake& hs) {
  if (r) check(!r->done);
  check(!hs.done());
}

void as_m1(std::span<const std::uint8_t> in) {
  Handshake r(Handshake::Role::responder, config(responder_identity()));
  auto step = r.on_message(in);
  check_not_done(step, r);
  if (step) check(step->reply.size() == kM2Size);
  // A second message after a failure is refused.
  if (!step) check(!r.on_message(in));
}

void as_m2(std::span<const std::uint8_t> in) {
  Handshake i(Handshake::Role::initiator, config(initiator_identity()));
  check(i.start().size() == kM1Size);
  auto step = i.on_message(in);
  check_not_done(step, i);
  check(!step);
}

void as_m1_then_m3(std::span<const std::uint8_t> in) {
  if (in.size() < kM1Size) return;
  Handshake r(Handshake::Role::responder, config(responder_identity()));
  auto step = r.on_message(in.first(kM1Size));
  if (!step) return;
  auto last = r.on_message(in.subspan(kM1Size));
  check_not_done(last, r);
  check(!last);
}

void deep_states(std::span<const std::uint8_t> in) {
  if (in.size() != kM3Size) return;
  Handshake i(Handshake::Role::initiator, config(initiator_identity()));
  Handshake r(Handshake::Role::responder, config(responder_identity()));
  auto m2 = r.on_message(i.start());
  check(m2.has_value());
  auto forged_m3 = r.on_message(in);
  check_not_done(forged_m3, r);
  check(!forged_m3);

  // The initiator's real M2 completes it; any further message is a protocol violation.
  auto m3 = i.on_message(m2->reply);
  check(m3.has_value() && m3->done && i.done());
  check(!i.on_message(in));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 4 * kHandshakeMaxMessage) return 0;  // drivers never pass longer messages
  const std::span<const std::uint8_t> in(data, size);
  as_m1(in);
  as_m2(in);
  as_m1_then_m3(in);
  deep_states(in);
  return 0;
}

// The trainer link's codec and the checks of a trainer against a run (node/trainer_protocol.hpp);
// the link itself runs end to end in tests/node/trainer_test.py (ctest TrainerProcess.*).
#include "node/trainer_protocol.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <msgpack.hpp>

namespace grove::node {
namespace {

TrainerHello small_hello() {
  TrainerHello h;
  h.version = kTrainerProtocol;
  h.model.tensors = {{"fc.weight", {4, 3}, "float32"}, {"fc.bias", {4}, "float32"}};
  h.outer = "diloco";
  h.inner_steps = 25;
  h.fragments = 5;
  h.outer_lr = 0.5f;
  h.outer_momentum = 0.8f;
  h.pid = 99;
  return h;
}

std::vector<std::uint8_t> packed(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& f) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> p(sb);
  f(p);
  const auto* d = reinterpret_cast<const std::uint8_t*>(sb.data());
  return {d, d + sb.size()};
}

TEST(TrainerProtocol, MessagesRoundTrip) {
  const auto h = small_hello();
  auto back = decode_trainer_message(encode_trainer_message(h));
  ASSERT_TRUE(back);
  EXPECT_EQ(std::get<TrainerHello>(*back), h);
  EXPECT_EQ(h.model.params(), 16u);
  TrainerStep s{0.25, 64, 0.5};
  back = decode_trainer_message(encode_trainer_message(s));
  ASSERT_TRUE(back);
  EXPECT_EQ(std::get<TrainerStep>(*back).loss, 0.25);
  EXPECT_EQ(std::get<TrainerStep>(*back).tokens, 64u);
  EXPECT_TRUE(std::holds_alternative<TrainerStored>(
      *decode_trainer_message(encode_trainer_message(TrainerStored{}))));
  back = decode_trainer_message(encode_trainer_message(TrainerSaved{"no space left"}));
  ASSERT_TRUE(back);
  EXPECT_EQ(std::get<TrainerSaved>(*back).why, "no space left");
  back = decode_trainer_message(encode_trainer_message(TrainerSaved{}));
  ASSERT_TRUE(back);
  EXPECT_EQ(std::get<TrainerSaved>(*back).why, "");
}

TEST(TrainerProtocol, CollectiveMessagesRoundTripAndAreBounded) {
  TrainerCollective c;
  c.kind = CollectiveKind::all_reduce;
  c.mean = true;
  c.wire = WireCodec::fp16;
  c.n = 25'000'000;
  c.timeout_s = 30;
  auto back = decode_trainer_message(encode_trainer_message(c));
  ASSERT_TRUE(back) << back.why();
  EXPECT_EQ(std::get<TrainerCollective>(*back), c);
  c = {};
  c.kind = CollectiveKind::send;
  c.peer = 3;
  c.n = 7;
  back = decode_trainer_message(encode_trainer_message(c));
  ASSERT_TRUE(back);
  EXPECT_EQ(std::get<TrainerCollective>(*back), c);
  back = decode_trainer_message(encode_trainer_message(TrainerBuffer{1u << 30}));
  ASSERT_TRUE(back);
  EXPECT_EQ(std::get<TrainerBuffer>(*back).bytes, 1u << 30);
  // Out of bounds, each with its reason.
  const auto rejects = [](const std::vector<std::uint8_t>& b, const char* why) {
    const auto r = decode_trainer_message(b);
    EXPECT_FALSE(r);
    EXPECT_NE(r.why().find(why), std::string::npos) << r.why();
  };
  rejects(packed([](auto& p) {
            p.pack_map(2);
            p.pack("op");
            p.pack("collective");
            p.pack("kind");
            p.pack("broadcast");
          }),
          "kind is");
  rejects(packed([](auto& p) {
            p.pack_map(3);
            p.pack("op");
            p.pack("collective");
            p.pack("kind");
            p.pack("send");
            p.pack("peer");
            p.pack(256);
          }),
          "peer is");
  rejects(packed([](auto& p) {
            p.pack_map(3);
            p.pack("op");
            p.pack("collective");
            p.pack("kind");
            p.pack("barrier");
            p.pack("timeout");
            p.pack(-1.0);
          }),
          "timeout is");
  rejects(packed([](auto& p) {
            p.pack_map(3);
            p.pack("op");
            p.pack("collective");
            p.pack("kind");
            p.pack("all_reduce");
            p.pack("n");
            p.pack(std::uint64_t{1} << 40);
          }),
          "n is");
  rejects(packed([](auto& p) {
            p.pack_map(2);
            p.pack("op");
            p.pack("buffer");
            p.pack("bytes");
            p.pack("many");
          }),
          "buffer: bytes");
}

TEST(TrainerProtocol, RejectsWhatItMustWithTheReason) {
  std::string why;
  const auto bad = [&](const std::vector<std::uint8_t>& b) {
    const auto r = decode_trainer_message(b);
    why = r.why();
    return !r && !why.empty();
  };
  EXPECT_TRUE(bad(encode_go(true))) << "a node's message";
  EXPECT_TRUE(bad(packed([](auto& p) { p.pack_array(0); })));
  auto h = small_hello();
  h.model.tensors[0].dtype = "int64";
  EXPECT_TRUE(bad(encode_trainer_message(h)));
  EXPECT_NE(why.find("not a float type"), std::string::npos) << why;
  h = small_hello();
  h.model.tensors[0].shape = {1ull << 30, 1ull << 30};
  EXPECT_TRUE(bad(encode_trainer_message(h))) << "2^60 parameters";
  h.model.tensors[0].shape = std::vector<std::uint64_t>(kMaxTensorDims + 1, 2);
  EXPECT_TRUE(bad(encode_trainer_message(h))) << "too many dimensions";
  h = small_hello();
  h.model.tensors.clear();
  EXPECT_TRUE(bad(encode_trainer_message(h))) << "no tensors";
  h = small_hello();
  h.model.tensors[0].name.clear();
  EXPECT_TRUE(bad(encode_trainer_message(h))) << "an empty name";
  // A NaN in the algorithm's numbers.
  EXPECT_TRUE(bad(packed([](auto& p) {
    p.pack_map(4);
    p.pack(std::string("op"));
    p.pack(std::string("hello"));
    p.pack(std::string("version"));
    p.pack(1);
    p.pack(std::string("tensors"));
    p.pack_array(1);
    p.pack_array(3);
    p.pack(std::string("w"));
    p.pack_array(1);
    p.pack(3);
    p.pack(std::string("float32"));
    p.pack(std::string("outer_lr"));
    p.pack(std::nan(""));
  })));
  auto trunc = encode_trainer_message(small_hello());
  trunc.pop_back();
  EXPECT_TRUE(bad(trunc)) << "truncated";
}

// Numbers are written as float64 whatever their value: msgpack-c's pack_double converts 2^64 to
// uint64_t (undefined; found by fuzz_trainer's round trip under UBSan).
TEST(TrainerProtocol, HugeNumbersAreWrittenAsFloats) {
  auto h = small_hello();
  h.outer_lr = std::ldexp(1.0f, 64);
  h.noloco_beta = -std::ldexp(1.0f, 63);
  auto back = decode_trainer_message(encode_trainer_message(h));
  ASSERT_TRUE(back) << back.text();
  EXPECT_EQ(std::get<TrainerHello>(*back).outer_lr, h.outer_lr);
  EXPECT_EQ(std::get<TrainerHello>(*back).noloco_beta, h.noloco_beta);
  TrainerStep s;
  s.loss = std::ldexp(1.0, 64);
  s.eval_loss = 3.0;
  back = decode_trainer_message(encode_trainer_message(s));
  ASSERT_TRUE(back) << back.text();
  EXPECT_EQ(std::get<TrainerStep>(*back).loss, s.loss);
  EXPECT_EQ(std::get<TrainerStep>(*back).eval_loss, 3.0);
}

TEST(TrainerProtocol, TheFirstTrainerMakesTheRunAndLaterOnesMustMatchIt) {
  const auto h = small_hello();
  RunConfig c;
  c.workload = WorkloadKind::external;  // as --bootstrap --workload external
  apply_hello(h, c);
  ASSERT_EQ(c.check(), "");
  EXPECT_EQ(c.outer, OuterMode::diloco);
  EXPECT_EQ(c.inner_steps, 25u);
  EXPECT_EQ(c.fragments, 5u);
  EXPECT_EQ(c.phase_steps(), 5u);
  EXPECT_FLOAT_EQ(c.outer_lr, 0.5f);
  EXPECT_EQ(c.model_params, 16u);
  EXPECT_EQ(c.model_tensors, 2u);
  EXPECT_EQ(c.model_spec, h.model.hash_hex());
  EXPECT_TRUE(c.run_name().starts_with("external-"));
  auto back = parse_run_config(c.to_text());
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, c);
  EXPECT_EQ(check_hello(h, c), "");

  auto other = h;
  other.model.tensors[1].shape = {5};
  EXPECT_NE(check_hello(other, c).find("does not match"), std::string::npos);
  other = h;
  other.model.tensors[1].name = "fc.b";  // same sizes, another name
  EXPECT_NE(check_hello(other, c).find("other parameter names"), std::string::npos);
  other = h;
  other.outer = "noloco";
  EXPECT_NE(check_hello(other, c).find("asked for noloco"), std::string::npos);
  other = h;
  other.inner_steps = 26;
  EXPECT_NE(check_hello(other, c).find("inner steps"), std::string::npos);
  other = h;
  other.fragments = 1;
  EXPECT_NE(check_hello(other, c).find("streaming fragments"), std::string::npos);
  other = h;
  other.version = 2;
  EXPECT_NE(check_hello(other, c).find("protocol version"), std::string::npos);
  // Overlapped rounds are the run's, set by the first trainer (grove.diloco(overlap=True)).
  other = h;
  other.overlap = 1;
  EXPECT_NE(check_hello(other, c).find("does not overlap"), std::string::npos);
  auto overlapped = c;
  apply_hello(other, overlapped);
  EXPECT_EQ(overlapped.overlap, 1u);
  EXPECT_NE(overlapped.run_name(), c.run_name());
  EXPECT_EQ(check_hello(other, overlapped), "");
  EXPECT_EQ(check_hello(h, overlapped), "");  // (a trainer that does not say)
  back = parse_run_config(overlapped.to_text());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->overlap, 1u);
  auto wire = decode_trainer_message(encode_trainer_message(other));
  ASSERT_TRUE(wire);
  EXPECT_EQ(std::get<TrainerHello>(*wire).overlap, std::optional<std::uint32_t>(1));
  // A per-step run (grove.init(model), DDP and DeMo scripts): outer none, no rounds.
  other = h;
  other.outer = "none";
  other.fragments = 0;
  RunConfig ps;
  ps.workload = WorkloadKind::external;
  apply_hello(other, ps);
  EXPECT_EQ(ps.check(), "");
  EXPECT_TRUE(ps.per_step);
  EXPECT_EQ(ps.outer_name(), "none");
  back = parse_run_config(ps.to_text());
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->per_step);
  EXPECT_EQ(*back, ps);
  EXPECT_NE(check_hello(h, ps).find("uses none"), std::string::npos);
  EXPECT_EQ(check_hello(other, ps), "");
  RunConfig builtin;  // (a built-in workload has no trainer to synchronise it)
  ASSERT_TRUE(builtin.set_outer("none"));
  EXPECT_NE(builtin.check().find("--workload external"), std::string::npos);
  ps.fragments = 5;
  EXPECT_NE(ps.check().find("no rounds"), std::string::npos);
  // A trainer that leaves the algorithm to the run is welcome.
  other = h;
  other.outer.reset();
  other.inner_steps = 0;
  other.fragments = 0;
  EXPECT_EQ(check_hello(other, c), "");
  // NoLoCo's compressed pairs: fragments make a NoLoCo run too.
  auto pairs = h;
  pairs.outer = "noloco";
  RunConfig nc;
  nc.workload = WorkloadKind::external;
  apply_hello(pairs, nc);
  EXPECT_EQ(nc.check(), "");
  EXPECT_EQ(nc.outer, OuterMode::noloco);
  EXPECT_EQ(nc.fragments, 5u);
  EXPECT_EQ(check_hello(pairs, nc), "");
  // Built-in runs take no trainer; external fields are refused on them.
  RunConfig gpt;
  EXPECT_NE(check_hello(h, gpt).find("built-in"), std::string::npos);
  gpt.model_params = 5;
  EXPECT_NE(gpt.check(), "");
}

}  // namespace
}  // namespace grove::node

// RunConfig: canonical text round trip, content address, strict bounded parsing.
#include "node/config.hpp"

#include <gtest/gtest.h>

namespace grove::node {
namespace {

RunConfig sample() {
  RunConfig c;
  c.workload = WorkloadKind::mlp;
  c.model = "tiny";
  c.seed = 42;
  c.nonce = "00112233445566aa";
  c.inner_steps = 7;
  c.lr = 3e-4f;
  c.outer = OuterMode::diloco;
  c.codec = WireCodec::bf16;
  c.data = DataKind::files;
  return c;
}

TEST(RunConfig, TextRoundTripsExactly) {
  const auto c = sample();
  auto back = parse_run_config(c.to_text());
  ASSERT_TRUE(back) << back.why();
  EXPECT_EQ(*back, c);
  EXPECT_EQ(back->to_text(), c.to_text());
  EXPECT_EQ(back->run_name(), c.run_name());
  // Floats survive exactly (printed with 9 significant digits).
  EXPECT_EQ(back->lr, 3e-4f);
}

TEST(RunConfig, NameIsContentAddressed) {
  auto a = sample(), b = sample();
  EXPECT_EQ(a.run_name(), b.run_name());
  EXPECT_TRUE(valid_run_name(a.run_name()));
  EXPECT_EQ(a.run_name().rfind("mlp-", 0), 0u);
  b.inner_steps = 8;
  EXPECT_NE(a.run_name(), b.run_name());
  b = sample();
  b.nonce = "00112233445566ab";  // same settings, another bootstrap: another run
  EXPECT_NE(a.run_name(), b.run_name());
  EXPECT_FALSE(valid_run_name("mlp-0123"));
  EXPECT_FALSE(valid_run_name("rnn-0123456789ab"));
  EXPECT_FALSE(valid_run_name("gpt-0123456789AB"));
}

TEST(RunConfig, RejectsNonCanonicalUnknownAndOutOfRange) {
  const std::string good = sample().to_text();
  std::string why;
  // Every single-field edit that is not canonical or not in range is refused with a reason.
  const auto replace = [&](const std::string& from, const std::string& to) {
    auto t = good;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  for (const auto& t : {
           replace("inner_steps 7\n", "inner_steps 07\n"),      // leading zero
           replace("inner_steps 7\n", "inner_steps 0\n"),       // out of range
           replace("inner_steps 7\n", "inner_steps x\n"),       // not a number
           replace("inner_steps 7\n", "inner_stepz 7\n"),       // unknown key
           replace("inner_steps 7\n", ""),                      // missing key
           replace("lr 0.000300000014\n", "lr 3e-4\n"),         // not canonical
           replace("lr 0.000300000014\n", "lr nan\n"),          // not finite
           replace("outer diloco\n", "outer sgd\n"),            // unknown mode
           replace("nonce 00112233445566aa\n", "nonce xyz\n"),  // bad nonce
           replace("grove-run v1\n", "grove-run v2\n"),         // unknown version
           good.substr(0, good.size() - 1),                     // no final newline
           good + "extra 1\n",                                  // extra line
           std::string(kMaxConfigText + 1, 'a'),                // too long
       }) {
    const auto r = parse_run_config(t);
    EXPECT_FALSE(r) << t;
    EXPECT_FALSE(r.why().empty());
  }
}

TEST(RunConfig, CheckNamesTheBadField) {
  auto c = sample();
  EXPECT_EQ(c.check(), "");
  c.warmup = c.schedule_steps + 1;
  EXPECT_NE(c.check().find("warmup"), std::string::npos);
  c = sample();
  c.beta2 = 1.0f;
  EXPECT_NE(c.check().find("betas"), std::string::npos);
  c = sample();
  c.noloco_group = 1;
  EXPECT_NE(c.check().find("noloco group"), std::string::npos);
  c = sample();
  c.noloco_lookahead = 1.0f;
  EXPECT_NE(c.check().find("look-ahead"), std::string::npos);
  c = sample();
  c.noloco_nesterov = 2;
  EXPECT_NE(c.check().find("noloco rule"), std::string::npos);
}

TEST(RunConfig, TheNoLoCoVariantAndTheOuterWarmUpArePartOfTheRun) {
  auto c = sample();
  c.noloco_group = 4;
  c.noloco_lookahead = 0.5f;
  c.outer_warmup = 10;
  c.noloco_nesterov = 1;
  c.noloco_warmup = 7;
  const auto r = parse_run_config(c.to_text());
  ASSERT_TRUE(r) << r.why();
  EXPECT_EQ(r->noloco_nesterov, 1u);
  EXPECT_EQ(r->noloco_warmup, 7u);
  EXPECT_EQ(r->noloco_group, 4u);
  EXPECT_EQ(r->noloco_lookahead, 0.5f);
  EXPECT_EQ(r->outer_warmup, 10u);
  EXPECT_NE(r->run_name(), sample().run_name());
}

}  // namespace
}  // namespace grove::node

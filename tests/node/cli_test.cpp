// The command line: every documented option parses; bad input gives a CliError naming the
// option; run config options are refused on joiners.
#include "node/cli.hpp"

#include <gtest/gtest.h>

namespace grove::node {
namespace {

CliOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "grove-node");
  return parse_cli(static_cast<int>(args.size()), args.data());
}

std::string error_of(std::vector<const char*> args) {
  try {
    parse(std::move(args));
  } catch (const CliError& e) {
    return e.what();
  }
  return "";
}

TEST(Cli, BootstrapWithRunConfig) {
  auto o = parse({"--bootstrap",   "--workload", "mlp",         "--model-size", "tiny",
                  "--inner-steps", "20",         "--outer",     "diloco",       "--outer-lr",
                  "0.5",           "--codec",    "bf16",        "--listen",     "127.0.0.1:7000",
                  "--state-dir",   "/tmp/x",     "--max-steps", "100",          "--metrics",
                  "m.jsonl",       "--threads",  "2",           "--overlap",    "--log-level",
                  "debug"});
  EXPECT_EQ(o.command, Command::run);
  EXPECT_TRUE(o.bootstrap);
  EXPECT_EQ(o.config.workload, WorkloadKind::mlp);
  EXPECT_EQ(o.config.model, "tiny");
  EXPECT_EQ(o.config.inner_steps, 20u);
  EXPECT_EQ(o.config.outer, OuterMode::diloco);
  EXPECT_FLOAT_EQ(o.config.outer_lr, 0.5f);
  EXPECT_EQ(o.config.codec, WireCodec::bf16);
  EXPECT_EQ(o.listen, "127.0.0.1:7000");
  EXPECT_EQ(o.state_dir, "/tmp/x");
  EXPECT_EQ(o.max_steps, 100u);
  EXPECT_EQ(o.metrics, "m.jsonl");
  EXPECT_EQ(o.threads, 2u);
  EXPECT_TRUE(o.overlap);
  EXPECT_EQ(o.log_level, "debug");
}

// SparseLoCo takes its own outer step unless told otherwise (lr 1.0, no momentum), and its
// numbers are checked.
TEST(Cli, SparseLoCoAndItsNumbers) {
  auto o = parse({"--bootstrap", "--outer", "sparseloco", "--topk", "32", "--topk-chunk", "1024",
                  "--topk-bits", "2", "--error-decay", "0.9"});
  EXPECT_EQ(o.config.outer, OuterMode::diloco);
  EXPECT_TRUE(o.config.sparseloco);
  EXPECT_EQ(o.config.outer_name(), "sparseloco");
  EXPECT_FLOAT_EQ(o.config.outer_lr, 1.0f);
  EXPECT_FLOAT_EQ(o.config.outer_momentum, 0.0f);
  EXPECT_EQ(o.config.topk, 32u);
  EXPECT_EQ(o.config.topk_chunk, 1024u);
  EXPECT_EQ(o.config.topk_bits, 2u);
  EXPECT_FLOAT_EQ(o.config.error_decay, 0.9f);
  EXPECT_TRUE(o.config.compressed_rounds());
  EXPECT_EQ(o.config.wire_name(), "top-32/1024 2-bit + error feedback");
  auto given = parse({"--bootstrap", "--outer-lr", "0.8", "--outer", "sparseloco"});
  EXPECT_FLOAT_EQ(given.config.outer_lr, 0.8f);
  auto e3 = parse({"--bootstrap", "--outer", "diloco", "--codec", "e3m0"});
  EXPECT_TRUE(e3.config.compressed_rounds());
  EXPECT_FALSE(parse({"--bootstrap", "--codec", "e3m0"}).config.compressed_rounds());  // NoLoCo
  EXPECT_NE(error_of({"--bootstrap", "--topk-chunk", "1000"}).find("power of two"),
            std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--topk-bits", "4"}).find("32 or 2"), std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--error-decay", "1.5"}).find("--error-decay"),
            std::string::npos);
  // Top-k larger than its chunk: the run config's check names it.
  RunConfig c = parse({"--bootstrap", "--outer", "sparseloco", "--topk", "5000"}).config;
  EXPECT_NE(c.check().find("top-k"), std::string::npos);
}

// DeMo: a per-step run of a built-in workload, its numbers part of the run config.
TEST(Cli, DeMoAndItsNumbers) {
  auto o = parse({"--bootstrap", "--outer", "demo", "--demo-decay", "0.99", "--demo-topk", "16",
                  "--demo-chunk", "32"});
  EXPECT_TRUE(o.config.demo);
  EXPECT_TRUE(o.config.per_step);
  EXPECT_EQ(o.config.outer_name(), "demo");
  EXPECT_FLOAT_EQ(o.config.demo_decay, 0.99f);
  EXPECT_EQ(o.config.demo_topk, 16u);
  EXPECT_EQ(o.config.demo_chunk, 32u);
  EXPECT_EQ(o.config.check(), "");
  auto back = parse_run_config(o.config.to_text());
  ASSERT_TRUE(back) << back.text();
  EXPECT_TRUE(back->demo);
  EXPECT_EQ(back->demo_topk, 16u);
  EXPECT_NE(o.config.run_name(), parse({"--bootstrap", "--outer", "demo"}).config.run_name());
  // Another outer after it ends the per-step run.
  EXPECT_FALSE(parse({"--bootstrap", "--outer", "demo", "--outer", "diloco"}).config.per_step);
  // A PyTorch trainer runs DeMo itself: the node refuses to step an external model.
  RunConfig ext = parse({"--bootstrap", "--outer", "demo", "--workload", "external"}).config;
  ext.model_params = 10;  // (what the first trainer's hello fills in)
  ext.model_tensors = 1;
  ext.model_spec = std::string(64, 'a');
  EXPECT_NE(ext.check().find("grove.demo"), std::string::npos) << ext.check();
  RunConfig cut =
      parse({"--bootstrap", "--outer", "demo", "--fragments", "2", "--inner-steps", "20"}).config;
  EXPECT_NE(cut.check().find("outer demo has no rounds"), std::string::npos) << cut.check();
  EXPECT_NE(error_of({"--bootstrap", "--demo-chunk", "300"}).find("--demo-chunk"),
            std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--demo-decay", "1"}).find("--demo-decay"), std::string::npos);
}

// NoLoCo's variant: a named set of its settings, single options after it still apply.
TEST(Cli, TheNoLoCoVariantSetsItsSettingsAndLaterOptionsWin) {
  auto o = parse({"--bootstrap", "--noloco-group", "4", "--noloco-lookahead", "0.3",
                  "--noloco-variant", "paper", "--noloco-beta", "0.9"});
  EXPECT_EQ(o.config.noloco_group, 2u);
  EXPECT_EQ(o.config.noloco_lookahead, 0.0f);
  EXPECT_FLOAT_EQ(o.config.noloco_alpha, 0.5f);
  EXPECT_FLOAT_EQ(o.config.noloco_beta, 0.9f);
  EXPECT_FLOAT_EQ(o.config.noloco_gamma, 0.7f);
  const RunConfig defaults;
  auto g = parse({"--bootstrap", "--noloco-group", "8", "--noloco-variant", "grove"});
  EXPECT_EQ(g.config.noloco_group, defaults.noloco_group);
  EXPECT_EQ(g.config.noloco_lookahead, defaults.noloco_lookahead);
  EXPECT_NE(error_of({"--bootstrap", "--noloco-variant", "best"}).find("paper or grove"),
            std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--noloco-group", "1"}).find("--noloco-group"),
            std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--noloco-rule", "best"}).find("paper or nesterov"),
            std::string::npos);
  auto n = parse({"--bootstrap", "--noloco-rule", "nesterov", "--noloco-warmup", "5"});
  EXPECT_EQ(n.config.noloco_nesterov, 1u);
  EXPECT_EQ(n.config.noloco_warmup, 5u);
  auto p = parse({"--bootstrap", "--noloco-rule", "nesterov", "--noloco-variant", "paper"});
  EXPECT_EQ(p.config.noloco_nesterov, 0u);
  EXPECT_EQ(p.config.noloco_warmup, 0u);
  auto w = parse({"--bootstrap", "--outer", "diloco", "--outer-warmup", "10"});
  EXPECT_EQ(w.config.outer_warmup, 10u);
}

// Fragments: dividing the inner steps (a round every H/F).
TEST(Cli, FragmentsAndTheirRules) {
  auto o = parse({"--bootstrap", "--outer", "diloco", "--inner-steps", "60", "--fragments", "4"});
  EXPECT_EQ(o.config.fragments, 4u);
  EXPECT_EQ(o.config.phase_steps(), 15u);
  EXPECT_EQ(o.config.check(), "");
  EXPECT_EQ(o.config.wire_name(), "fp16, 1/4 of the model a round");
  auto sp =
      parse({"--bootstrap", "--outer", "sparseloco", "--inner-steps", "30", "--fragments", "3"});
  EXPECT_EQ(sp.config.check(), "");
  EXPECT_EQ(RunConfig{}.fragments, 1u);
  EXPECT_EQ(RunConfig{}.phase_steps(), RunConfig{}.inner_steps);
  EXPECT_NE(error_of({"--bootstrap", "--fragments", "0"}).find("--fragments"), std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--fragments", "65"}).find("--fragments"), std::string::npos);
  EXPECT_NE(parse({"--bootstrap", "--outer", "diloco", "--inner-steps", "50", "--fragments", "4"})
                .config.check()
                .find("must divide the inner steps"),
            std::string::npos);
  // NoLoCo: compressed pairs (a pair averages one fragment a round).
  auto no = parse({"--bootstrap", "--inner-steps", "40", "--fragments", "4"});
  EXPECT_EQ(no.config.check(), "");
  EXPECT_EQ(no.config.phase_steps(), 10u);
  EXPECT_EQ(no.config.wire_name(), "fp16, 1/4 of the model a round");

  // With --overlap: a round's new φ is mixed into its fragment of θ.
  EXPECT_TRUE(parse({"--bootstrap", "--outer", "diloco", "--inner-steps", "40", "--fragments", "4",
                     "--overlap"})
                  .overlap);
  // In the run's config text, and back.
  const auto text = o.config.to_text();
  EXPECT_NE(text.find("\nfragments 4\n"), std::string::npos);
  auto back = parse_run_config(text);
  ASSERT_TRUE(back) << back.text();
  EXPECT_EQ(back->fragments, 4u);
}

TEST(Cli, JoinWithPeersAndData) {
  auto o = parse({"--peer", "10.0.0.1:7000", "--peer", "[::1]:7001", "--data", "a.txt", "b.txt",
                  "--run", "gpt-0123456789ab"});
  EXPECT_FALSE(o.bootstrap);
  EXPECT_EQ(o.peers, (std::vector<std::string>{"10.0.0.1:7000", "[::1]:7001"}));
  EXPECT_EQ(o.data, (std::vector<std::string>{"a.txt", "b.txt"}));
  EXPECT_EQ(o.run, "gpt-0123456789ab");
  EXPECT_TRUE(o.relay);
  EXPECT_TRUE(o.upnp);
  EXPECT_TRUE(o.advertise.empty());
  auto a = parse({"--advertise", "203.0.113.5:7400", "--advertise", "[2001:db8::5]:7400",
                  "--no-relay", "--no-upnp"});
  EXPECT_EQ(a.advertise, (std::vector<std::string>{"203.0.113.5:7400", "[2001:db8::5]:7400"}));
  EXPECT_FALSE(a.relay);
  EXPECT_FALSE(a.upnp);
  EXPECT_FALSE(a.checkpoint_every);
  auto k = parse({"--checkpoint-every", "5", "--checkpoint-minutes", "30"});
  EXPECT_EQ(k.checkpoint_every, 5u);
  EXPECT_EQ(k.checkpoint_minutes, 30u);
  EXPECT_NE(error_of({"--checkpoint-every", "0"}).find("--checkpoint-every"), std::string::npos);
  // Data at bootstrap makes a files run.
  EXPECT_EQ(parse({"--bootstrap", "--data", "a.txt"}).config.data, DataKind::files);
  EXPECT_EQ(parse({"--bootstrap"}).config.data, DataKind::synthetic);
}

TEST(Cli, Subcommands) {
  auto s = parse({"status", "--json", "--peer", "h:1"});
  EXPECT_EQ(s.command, Command::status);
  EXPECT_TRUE(s.json);
  auto r = parse({"request", "diloco", "--from-round", "12", "--peer", "h:1"});
  EXPECT_EQ(r.command, Command::request);
  EXPECT_EQ(r.request_mode, OuterMode::diloco);
  EXPECT_EQ(r.from_round, 12u);
  EXPECT_EQ(parse({"request", "noloco"}).request_mode, OuterMode::noloco);
  EXPECT_EQ(parse({"--help"}).command, Command::help);
  EXPECT_EQ(parse({"status", "-h"}).command, Command::help);
  auto t = parse({"top", "--peer", "h:1", "--state-dir", "d"});
  EXPECT_EQ(t.command, Command::top);
  EXPECT_EQ(t.peers, std::vector<std::string>{"h:1"});
  EXPECT_NE(error_of({"top", "--json"}).find("--json"), std::string::npos);
  EXPECT_NE(error_of({"top", "--bootstrap"}).find("not an option"), std::string::npos);
}

TEST(Cli, BadInputNamesTheProblem) {
  EXPECT_NE(error_of({"--inner-steps", "20"}).find("run config"), std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--inner-steps", "0"}).find("--inner-steps"),
            std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--inner-steps", "ten"}).find("got 'ten'"), std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--lr", "-1"}).find("--lr"), std::string::npos);
  EXPECT_NE(
      error_of({"--bootstrap", "--outer", "sgd"}).find("noloco, diloco, sparseloco, demo or none"),
      std::string::npos);
  EXPECT_NE(error_of({"--peer", "nohost"}).find("HOST:PORT"), std::string::npos);
  EXPECT_NE(error_of({"--peer", "h:70000"}).find("port"), std::string::npos);
  EXPECT_NE(error_of({"--peer"}).find("missing value"), std::string::npos);
  EXPECT_NE(error_of({"--advertise", "example.org:7400"}).find("an address, not a name"),
            std::string::npos);
  EXPECT_NE(error_of({"--advertise", "203.0.113.5"}).find("HOST:PORT"), std::string::npos);
  EXPECT_NE(error_of({"status", "--advertise", "203.0.113.5:1"}).find("not an option"),
            std::string::npos);
  EXPECT_NE(error_of({"--frobnicate"}).find("unknown option --frobnicate"), std::string::npos);
  EXPECT_NE(error_of({"stray"}).find("unexpected argument"), std::string::npos);
  EXPECT_NE(error_of({"status", "--bootstrap"}).find("not an option"), std::string::npos);
  EXPECT_NE(error_of({"request", "sgd"}).find("diloco or noloco"), std::string::npos);
  EXPECT_NE(error_of({"request"}).find("diloco or noloco"), std::string::npos);
  EXPECT_NE(error_of({"--log-level", "loud"}).find("--log-level"), std::string::npos);
  EXPECT_NE(error_of({"--run", "x"}).find("run name"), std::string::npos);
  EXPECT_NE(error_of({"--bootstrap", "--warmup", "50", "--schedule-steps", "10"}).find("--warmup"),
            std::string::npos);
  EXPECT_NE(error_of({"--swarm-key", "abc"}).find("--swarm-key: swarm key must be exactly 64"),
            std::string::npos);
  const std::string hex(64, 'a');
  const char* key = hex.c_str();
  EXPECT_NE(error_of({"--bootstrap", "--open", "--swarm-key", key}).find("--open is a swarm"),
            std::string::npos);
  EXPECT_NE(error_of({"--swarm-key", key, "--swarm-key-file", "k"}).find("give one"),
            std::string::npos);
  EXPECT_NE(error_of({"status", "--open"}).find("not an option"), std::string::npos);
  EXPECT_EQ(error_of({"--peer", "h:1", "--swarm-key", key}), "");
  EXPECT_EQ(error_of({"--bootstrap", "--open"}), "");
  EXPECT_EQ(error_of({"--bootstrap"}), "");
}

TEST(Cli, LinkEmulation) {
  const auto e = parse_link_emulation("--emulate-link", "100mbit,100ms");
  EXPECT_DOUBLE_EQ(e.bytes_per_sec, 12.5e6);
  EXPECT_EQ(e.rtt_ms, 100u);
  EXPECT_EQ(e.loss, 0.0);
  const auto f = parse_link_emulation("--emulate-link", "1.5gbit,0ms,0.01");
  EXPECT_DOUBLE_EQ(f.bytes_per_sec, 1.5e9 / 8);
  EXPECT_EQ(f.rtt_ms, 0u);
  EXPECT_DOUBLE_EQ(f.loss, 0.01);
  EXPECT_EQ(parse_link_emulation("--emulate-link", "0,40ms").bytes_per_sec, 0.0);
  EXPECT_EQ(parse_link_emulation("--emulate-link", "512kbit").bytes_per_sec, 64e3);
  for (const char* bad : {"", "100", "100mbps", "mbit", "-1mbit", "100mbit,100", "100mbit,ms",
                          "100mbit,100ms,1", "100mbit,100ms,0.1,3", "nanmbit", "100mbit,,"})
    EXPECT_THROW(parse_link_emulation("--emulate-link", bad), CliError) << bad;
  const char* argv[] = {"grove-node", "--emulate-link", "10mbit,50ms"};
  EXPECT_EQ(parse_cli(3, argv).emulate_link->rtt_ms, 50u);
  const char* status[] = {"grove-node", "status", "--emulate-link", "10mbit"};
  EXPECT_THROW(parse_cli(4, status), CliError);
}

TEST(Cli, HelpDocumentsEveryOption) {
  const auto help = usage();
  for (const char* opt : {"--bootstrap",
                          "--peer",
                          "--listen",
                          "--state-dir",
                          "--swarm-key-file",
                          "--run",
                          "--data",
                          "--overlap",
                          "--max-steps",
                          "--metrics",
                          "--threads",
                          "--log-level",
                          "--no-progress",
                          "--workload",
                          "--model-size",
                          "--seed",
                          "--inner-steps",
                          "--batch",
                          "--seq-len",
                          "--lr",
                          "--warmup",
                          "--schedule-steps",
                          "--weight-decay",
                          "--clip",
                          "--outer",
                          "--outer-lr",
                          "--outer-momentum",
                          "--noloco-alpha",
                          "--noloco-beta",
                          "--noloco-gamma",
                          "--outer-warmup",
                          "--noloco-group",
                          "--noloco-lookahead",
                          "--noloco-rule",
                          "--noloco-warmup",
                          "--codec",
                          "--eval-every",
                          "--eval-batches",
                          "status",
                          "request",
                          "--json",
                          "--from-round",
                          "--emulate-link",
                          "--swarm-key",
                          "--open"})
    EXPECT_NE(help.find(opt), std::string::npos) << opt;
}

}  // namespace
}  // namespace grove::node

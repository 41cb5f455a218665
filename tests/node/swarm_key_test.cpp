// Which swarm key a node uses: closed by default, the state dir's copy, --open, a key given.
#include "node/swarm_key.hpp"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/node/temp_dir.hpp"

#include "transport/error.hpp"

namespace grove::node {
namespace {

namespace fs = std::filesystem;

struct Dir : testing::TempDir {
  Dir() : TempDir("grove-key-") {}
};

std::string file_text(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  f >> s;
  return s;
}

TEST(SwarmKey, ABootstrapMakesAKeyInItsStateDirAndARestartUsesIt) {
  Dir d;
  CliOptions o;
  o.bootstrap = true;
  const auto made = choose_swarm_key(o, d.path);
  ASSERT_TRUE(made.key);
  EXPECT_EQ(file_text(swarm_key_path(d.path)), made.key->hex());
  EXPECT_EQ(fs::status(swarm_key_path(d.path)).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  // A restart (no --bootstrap, no key option) finds it.
  const auto again = choose_swarm_key(CliOptions{}, d.path);
  ASSERT_TRUE(again.key);
  EXPECT_EQ(again.key->hex(), made.key->hex());
  // A second bootstrap on the same dir keeps the key too (its nodes can still come back).
  EXPECT_EQ(choose_swarm_key(o, d.path).key->hex(), made.key->hex());
}

TEST(SwarmKey, OpenMeansNoKeyAndAJoinerWithoutOneHasNone) {
  Dir d;
  CliOptions o;
  o.bootstrap = true;
  o.open = true;
  EXPECT_FALSE(choose_swarm_key(o, d.path).key);
  EXPECT_FALSE(fs::exists(swarm_key_path(d.path)));
  EXPECT_FALSE(choose_swarm_key(CliOptions{}, d.path).key);
}

TEST(SwarmKey, AKeyGivenIsKeptForTheNextStart) {
  Dir d;
  const std::string hex(64, 'c');
  CliOptions o;
  o.swarm_key = hex;
  EXPECT_EQ(choose_swarm_key(o, d.path).key->hex(), hex);
  EXPECT_EQ(file_text(swarm_key_path(d.path)), hex);
  EXPECT_EQ(client_swarm_key(CliOptions{}, d.path)->hex(), hex);
  // From a file: the same.
  Dir e;
  const auto file = (d.path / "other.key").string();
  std::ofstream(file) << std::string(64, 'd') << "\n";
  CliOptions f;
  f.swarm_key_file = file;
  EXPECT_EQ(choose_swarm_key(f, e.path).key->hex(), std::string(64, 'd'));
  EXPECT_EQ(file_text(swarm_key_path(e.path)), std::string(64, 'd'));
  // --open ignores the state dir's copy.
  CliOptions open;
  open.open = true;
  EXPECT_FALSE(choose_swarm_key(open, e.path).key);
}

TEST(SwarmKey, ABadKeyFileIsAConfigError) {
  Dir d;
  std::ofstream(swarm_key_path(d.path)) << "not a key\n";
  EXPECT_THROW(choose_swarm_key(CliOptions{}, d.path), transport::ConfigError);
  CliOptions o;
  o.swarm_key_file = (d.path / "missing.key").string();
  EXPECT_THROW(choose_swarm_key(o, d.path), transport::ConfigError);
}

}  // namespace
}  // namespace grove::node

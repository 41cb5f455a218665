// The contacts a node keeps for a restart: bounded, checked, newest first.
#include "node/contacts.hpp"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/node/temp_dir.hpp"

namespace grove::node {
namespace {

namespace fs = std::filesystem;

struct Dir : testing::TempDir {
  Dir() : TempDir("grove-contacts-") {}
};

TEST(Contacts, SavedAndLoadedNewestFirstWithoutDuplicates) {
  Dir d;
  EXPECT_TRUE(load_contacts(d.path).empty());  // no file yet
  const auto merged = merge_contacts({"10.0.0.2:7400", "[fd00::1]:7400", "10.0.0.2:7400"},
                                     {"10.0.0.9:7400", "[fd00::1]:7400"});
  EXPECT_EQ(merged, (std::vector<std::string>{"10.0.0.2:7400", "[fd00::1]:7400", "10.0.0.9:7400"}));
  ASSERT_TRUE(save_contacts(d.path, merged));
  EXPECT_EQ(load_contacts(d.path), merged);
}

TEST(Contacts, AtMostThirtyTwo) {
  Dir d;
  std::vector<std::string> many;
  for (int i = 1; i <= 100; ++i) many.push_back("10.0.1." + std::to_string(i) + ":7400");
  const auto merged = merge_contacts(many, {"10.9.9.9:1"});
  ASSERT_EQ(merged.size(), kMaxContacts);
  EXPECT_EQ(merged.front(), "10.0.1.1:7400");
  ASSERT_TRUE(save_contacts(d.path, many));  // (bounded when written too)
  EXPECT_EQ(load_contacts(d.path).size(), kMaxContacts);
}

TEST(Contacts, AnEditedOrCutFileIsReadSafely) {
  Dir d;
  {
    std::ofstream f(contacts_path(d.path), std::ios::binary);
    f << "10.0.0.1:7400\n"
      << "no port\n"
      << "host:99999\n"
      << ":7400\n"
      << std::string(5000, 'x') << ":1\n"
      << "bad\x01:7\n"
      << "\n"
      << "example.org:7400\n";
    for (int i = 0; i < 100000; ++i) f << "junk";
    f << "\n10.0.0.3:7400";  // past the first 16 KiB: never read
  }
  EXPECT_EQ(load_contacts(d.path), (std::vector<std::string>{"10.0.0.1:7400", "example.org:7400"}));
  EXPECT_FALSE(plausible_address(""));
  EXPECT_FALSE(plausible_address("h:0"));
  EXPECT_TRUE(plausible_address("[::1]:1"));
}

}  // namespace
}  // namespace grove::node

// The contacts a node keeps for a restart: bounded, checked, newest first.
#include "node/contacts.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

// A restart listens on its last port when that is free (port 0 asked), else on any.
TEST(Contacts, ARestartTakesItsLastPortWhenFree) {
  Dir d;
  EXPECT_EQ(sticky_listen("127.0.0.1:0", d.path), "127.0.0.1:0");  // no last port yet
  // A port in use: a listening socket holds it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string held = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  remember_port(d.path, held);
  EXPECT_EQ(sticky_listen("127.0.0.1:0", d.path), "127.0.0.1:0");
  ::close(fd);
  // Free again: taken.
  EXPECT_EQ(sticky_listen("127.0.0.1:0", d.path), held);
  EXPECT_EQ(sticky_listen("127.0.0.1:7400", d.path), "127.0.0.1:7400");  // a port was asked for
  EXPECT_EQ(sticky_listen("[::1]:0", d.path).rfind("[::1]:", 0), 0u);
}

}  // namespace
}  // namespace grove::node

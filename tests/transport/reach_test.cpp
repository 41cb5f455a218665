// Reachability: the check's codecs, the helper's policy, the verdict, and dial-back checks
// between real TCP hosts (one that listens, one whose advertised address leads nowhere).
#include "transport/reach.hpp"

#include <gtest/gtest.h>

#include "tests/transport/test_util.hpp"

namespace grove::transport {
namespace {

using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;
using namespace test;

TEST(Reach, CodecsRoundTripAndRejectWhatIsOutOfBounds) {
  ReachRequest q{{"192.0.2.1:7400", "[2001:db8::1]:7400"}};
  auto q2 = decode_reach_request(encode_reach_request(q));
  ASSERT_TRUE(q2);
  EXPECT_EQ(q2->addresses, q.addresses);
  ReachReply r{"192.0.2.1:5555",
               {{"192.0.2.1:7400", ReachCode::ok}, {"x:1", ReachCode::timed_out}}};
  auto r2 = decode_reach_reply(encode_reach_reply(r));
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->observed, r.observed);
  EXPECT_EQ(r2->results, r.results);
  // Too many addresses, too long an address, a truncated body, an unknown code or version.
  EXPECT_FALSE(decode_reach_request(encode_reach_request({std::vector<std::string>(5, "a:1")})));
  EXPECT_FALSE(decode_reach_request(encode_reach_request({{std::string(201, 'a')}})));
  auto bytes = encode_reach_reply(r);
  bytes.pop_back();
  EXPECT_FALSE(decode_reach_reply(bytes));
  auto bad_code = encode_reach_reply({"o", {{"a:1", ReachCode::not_checked}}});
  bad_code.back() = 5;
  EXPECT_FALSE(decode_reach_reply(bad_code));
  auto v2 = encode_reach_request(q);
  v2[1] = 2;  // [2, ...]
  EXPECT_FALSE(decode_reach_request(v2));
  EXPECT_FALSE(decode_reach_request(encode_reach_reply(r)));
}

TEST(Reach, AddressHelpers) {
  EXPECT_EQ(ip_of("192.0.2.1:7400"), "192.0.2.1");
  EXPECT_EQ(ip_of("[2001:db8::1]:7400"), "2001:db8::1");
  EXPECT_EQ(ip_of("[::ffff:192.0.2.9]:7400"), "192.0.2.9");
  EXPECT_EQ(ip_of("example.org:7400"), "");
  EXPECT_EQ(ip_of("nonsense"), "");
  EXPECT_EQ(join_host_port("2001:db8::1", 7400), "[2001:db8::1]:7400");
  EXPECT_EQ(join_host_port("192.0.2.1", 7400), "192.0.2.1:7400");
}

TEST(Reach, HelpersDialOnlyTheRequestersOwnAddressAndNotTooOften) {
  ReachPolicy p({ms(10'000), 2, 4096});
  const NodeId a = Identity::generate().id(), b = Identity::generate().id(),
               c = Identity::generate().id();
  ReachRequest q{
      {"198.51.100.7:7400", "203.0.113.9:7400", "[2001:db8::7]:7400", "[2001:db8::8]:7400"}};
  auto adm = p.admit(a, "198.51.100.7:40001", q, ms(0));
  ASSERT_EQ(adm.refused, "");
  // Its own IP yes, a third party's IPv4 no, one IPv6 address (the other family) yes, a second no.
  EXPECT_EQ(adm.dial, (std::vector<bool>{true, false, true, false}));
  // Again within the interval: refused; after it: admitted.
  EXPECT_NE(p.admit(a, "198.51.100.7:40001", q, ms(5'000)).refused, "");
  p.finished();
  EXPECT_EQ(p.admit(a, "198.51.100.7:40001", q, ms(10'000)).refused, "");
  // Two in flight at most.
  EXPECT_EQ(p.admit(b, "[::ffff:198.51.100.8]:1", q, ms(10'000)).refused, "");
  EXPECT_NE(p.admit(c, "198.51.100.9:1", q, ms(10'000)).refused, "");
  p.finished();
  EXPECT_EQ(p.admit(c, "198.51.100.9:1", q, ms(10'000)).refused, "");
}

TEST(Reach, AnAddressNeedsTwoHelpersWhenTwoAnswered) {
  const NodeId h1 = Identity::generate().id(), h2 = Identity::generate().id();
  ReachCheck one({"192.0.2.1:7400", "10.0.0.1:7400"});
  one.on_reply(h1,
               {"192.0.2.1:1",
                {{"192.0.2.1:7400", ReachCode::ok}, {"10.0.0.1:7400", ReachCode::not_checked}}});
  auto v = one.verdict();
  EXPECT_EQ(v.helpers, 1u);
  EXPECT_EQ(v.verified, (std::vector<std::string>{"192.0.2.1:7400"}));
  EXPECT_EQ(v.observed, "192.0.2.1");
  one.on_reply(h2, {"192.0.2.1:2", {{"192.0.2.1:7400", ReachCode::timed_out}}});
  EXPECT_FALSE(one.verdict().reachable()) << "one helper of two cannot vouch alone";
  ReachCheck none({"192.0.2.1:7400"});
  none.on_failure(h1);
  EXPECT_FALSE(none.verdict().reachable());
  EXPECT_EQ(none.verdict().failed, 1u);
}

// Real hosts on loopback: two helpers check a node that listens where it says (reachable),
// then a node whose advertised address leads to a closed port (unreachable); a third request
// too soon after the first is refused.
TEST(Reach, TwoHelpersCheckRealAddresses) {
  World w;
  auto h1 = w.host(), h2 = w.host(), node = w.host();
  serve_reach_checks(*h1);
  serve_reach_checks(*h2);
  w.start(h1);
  w.start(h2);
  w.start(node);
  auto ask = [&](const std::shared_ptr<Host>& helper, std::vector<std::string> addrs) {
    return call(node, PeerRef::at(helper->address()), kReachMethod, [&] {
      auto b = encode_reach_request({std::move(addrs)});
      return std::string(b.begin(), b.end());
    }());
  };
  ReachCheck check({node->address(), "127.0.0.1:1"});
  for (auto& h : {h1, h2}) {
    auto r = ask(h, check.candidates());
    ASSERT_TRUE(r) << r.error().message();
    auto rep = decode_reach_reply(as_bytes(*r));
    ASSERT_TRUE(rep);
    check.on_reply(h->id(), *rep);
  }
  auto v = check.verdict();
  EXPECT_EQ(v.helpers, 2u);
  EXPECT_EQ(v.verified, (std::vector<std::string>{node->address()}));
  EXPECT_EQ(v.observed, "127.0.0.1");
  auto again = ask(h1, {node->address()});
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error(), make_error_code(errc::rejected)) << again.error().message();
}

}  // namespace
}  // namespace grove::transport

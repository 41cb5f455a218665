// The address check behind UPnP port mapping (the mapping itself runs against a real miniupnpd
// in tests/node/nat_test.sh upnp).
#include "node/port_mapping.hpp"

#include <gtest/gtest.h>

namespace grove::node {
namespace {

TEST(PortMapping, OnlyPublicExternalAddressesAreWorthAMapping) {
  for (const char* ip : {"10.1.2.3",
                         "172.16.0.1",
                         "172.31.255.255",
                         "192.168.1.1",
                         "100.64.0.1",
                         "100.127.255.254",
                         "127.0.0.1",
                         "169.254.3.4",
                         "0.0.0.0",
                         "192.0.2.7",
                         "198.18.0.1",
                         "198.19.255.255",
                         "198.51.100.1",
                         "203.0.113.9",
                         "224.0.0.251",
                         "255.255.255.255",
                         "192.0.0.8",
                         "not an address",
                         "",
                         "2001:db8::1"})
    EXPECT_TRUE(is_non_public_ipv4(ip)) << ip;
  for (const char* ip : {"1.1.1.1", "11.99.0.11", "172.32.0.1", "172.15.255.255", "100.128.0.1",
                         "198.20.0.1", "192.169.0.1", "203.0.114.1", "223.255.255.254"})
    EXPECT_FALSE(is_non_public_ipv4(ip)) << ip;
}

}  // namespace
}  // namespace grove::node

#include "transport/reach.hpp"

#include <algorithm>
#include <iterator>

#include <spdlog/spdlog.h>
#include <boost/asio/ip/address.hpp>

#include "transport/frame.hpp"
#include "transport/host.hpp"
#include "transport/schema.hpp"
#include "transport/tcp_link.hpp"

namespace grove::transport {

const char* to_string(ReachCode c) {
  switch (c) {
    case ReachCode::ok:
      return "reached";
    case ReachCode::unreachable:
      return "refused or no route";
    case ReachCode::timed_out:
      return "no answer";
    case ReachCode::wrong_peer:
      return "another node answers there";
    case ReachCode::not_checked:
      return "not checked";
  }
  return "?";
}

namespace {
namespace sc = schema;
constexpr sc::Str kAddress{kReachMaxAddress};
constexpr auto kRequestSchema =
    sc::record<ReachRequest>("reach request", 1,
                             sc::field("addresses", &ReachRequest::addresses,
                                       sc::List<sc::Str>{kReachMaxAddresses, kAddress}));
constexpr auto kReplySchema = sc::record<ReachReply>(
    "reach reply", 1, sc::field("observed", &ReachReply::observed, kAddress),
    sc::field(
        "results", &ReachReply::results,
        sc::list(kReachMaxAddresses,
                 sc::row<ReachResult>(
                     "reach result", sc::field("address", &ReachResult::address, kAddress),
                     sc::field("code", &ReachResult::code,
                               sc::Uint{static_cast<std::uint64_t>(ReachCode::not_checked)})))));
}  // namespace

std::vector<std::uint8_t> encode_reach_request(const ReachRequest& r) {
  return sc::encode(kRequestSchema, r);
}

Result<ReachRequest> decode_reach_request(std::span<const std::uint8_t> b) {
  return sc::decode(kRequestSchema, b);
}

std::vector<std::uint8_t> encode_reach_reply(const ReachReply& r) {
  return sc::encode(kReplySchema, r);
}

Result<ReachReply> decode_reach_reply(std::span<const std::uint8_t> b) {
  return sc::decode(kReplySchema, b);
}

std::string ip_of(const std::string& address) {
  std::string host;
  std::uint16_t port = 0;
  if (!split_host_port(address, host, port)) return {};
  boost::system::error_code ec;
  auto ip = boost::asio::ip::make_address(host, ec);
  if (ec) return {};
  if (ip.is_v6() && ip.to_v6().is_v4_mapped())
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, ip.to_v6()).to_string();
  return ip.to_string();
}

bool is_ipv6(const std::string& ip) {
  return ip.find(':') != std::string::npos;
}

std::string join_host_port(const std::string& ip, std::uint16_t port) {
  return (is_ipv6(ip) ? "[" + ip + "]" : ip) + ":" + std::to_string(port);
}

ReachPolicy::Admission ReachPolicy::admit(const NodeId& requester, const std::string& observed,
                                          const ReachRequest& req, std::chrono::milliseconds now) {
  Admission a;
  if (in_flight_ >= opts_.max_in_flight) {
    a.refused = "too many checks under way";
    return a;
  }
  if (auto it = last_.find(requester); it != last_.end() && now - it->second < opts_.min_interval) {
    a.refused = "asked again too soon";
    return a;
  }
  const std::string seen = ip_of(observed);
  if (seen.empty()) {
    a.refused = "the request's own address is unknown";
    return a;
  }
  // The IP the request came from, and one address of the other family (an IPv6 address of a
  // node that reached us over IPv4, or the reverse): nothing else, so that a check cannot be
  // aimed at a third party.
  bool other_family = false;
  for (const auto& addr : req.addresses) {
    const std::string ip = ip_of(addr);
    bool dial = !ip.empty() && ip == seen;
    if (!dial && !ip.empty() && is_ipv6(ip) != is_ipv6(seen) && !other_family)
      dial = other_family = true;
    a.dial.push_back(dial);
  }
  if (last_.size() >= opts_.max_tracked) {
    for (auto it = last_.begin(); it != last_.end();)  // forget the ones past their interval
      it = now - it->second >= opts_.min_interval ? last_.erase(it) : std::next(it);
    if (last_.size() >= opts_.max_tracked) {
      a.refused = "too many checks under way";
      a.dial.clear();
      return a;
    }
  }
  last_[requester] = now;
  ++in_flight_;
  return a;
}

void serve_reach_checks(Host& host, ReachPolicyOptions o, std::chrono::milliseconds probe_timeout) {
  auto policy = std::make_shared<ReachPolicy>(o);
  std::weak_ptr<Host> weak = host.weak_from_this();
  host.handle(
      kReachMethod, [policy, weak, probe_timeout](const PeerInfo& from, Payload body, Responder r) {
        auto h = weak.lock();
        if (!h) return;
        auto req = decode_reach_request(body.bytes());
        if (!req) {
          spdlog::info("reach: malformed check request from {}", short_id(from.id));
          return r.fail(errc::malformed, "malformed reach.check request");
        }
        const auto now =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch());
        auto adm = policy->admit(from.id, from.address, *req, now);
        if (!adm.refused.empty()) return r.fail(errc::rejected, adm.refused);
        struct Pending {
          ReachReply reply;
          std::size_t left = 0;
          Responder r;
          std::shared_ptr<ReachPolicy> policy;
          explicit Pending(Responder rr, std::shared_ptr<ReachPolicy> p)
              : r(std::move(rr)), policy(std::move(p)) {}
          void done() {
            policy->finished();
            r.reply(encode_reach_reply(reply));
          }
        };
        auto p = std::make_shared<Pending>(std::move(r), policy);
        p->reply.observed = from.address;
        for (std::size_t i = 0; i < req->addresses.size(); ++i) {
          p->reply.results.push_back({req->addresses[i], ReachCode::not_checked});
          p->left += adm.dial[i];
        }
        if (p->left == 0) return p->done();
        for (std::size_t i = 0; i < req->addresses.size(); ++i) {
          if (!adm.dial[i]) continue;
          h->probe(req->addresses[i], from.id, probe_timeout, [p, i](std::error_code ec) {
            p->reply.results[i].code =
                !ec                                       ? ReachCode::ok
                : ec == make_error_code(errc::timed_out)  ? ReachCode::timed_out
                : ec == make_error_code(errc::wrong_peer) ? ReachCode::wrong_peer
                                                          : ReachCode::unreachable;
            if (--p->left == 0) p->done();
          });
        }
      });
}

void ReachCheck::on_reply(const NodeId& helper, const ReachReply& r) {
  replies_[helper] = r;
}

ReachCheck::Verdict ReachCheck::verdict() const {
  Verdict v;
  v.helpers = replies_.size();
  v.failed = failed_.size();
  // Two helpers must agree (one, when only one answered): a single helper cannot make us
  // believe we are reachable.
  const std::size_t need = std::min<std::size_t>(2, replies_.size());
  for (const auto& c : candidates_) {
    std::size_t reached = 0;
    for (const auto& [id, rep] : replies_)
      for (const auto& [addr, code] : rep.results)
        if (addr == c && code == ReachCode::ok) {
          ++reached;
          break;
        }
    if (need > 0 && reached >= need) v.verified.push_back(c);
  }
  std::map<std::string, std::size_t> seen;
  for (const auto& [id, rep] : replies_)
    if (auto ip = ip_of(rep.observed); !ip.empty()) ++seen[ip];
  std::size_t best = 0;
  for (const auto& [ip, n] : seen)
    if (n > best) best = n, v.observed = ip;
  return v;
}

}  // namespace grove::transport

// StatusClient (status_client.hpp): one Host on an io_context thread of its own.
#include "node/status_client.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <thread>

#include "transport/host.hpp"
#include "transport/identity.hpp"
#include "transport/strand.hpp"

namespace grove::node {

std::string client_target(const CliOptions& o, std::string& why) {
  if (!o.peers.empty()) return o.peers.front();
  const auto dir = o.state_dir.empty() ? default_state_dir() : o.state_dir;
  std::ifstream f(std::filesystem::path(dir) / "node.addr");
  std::string target;
  if (!(f >> target)) {
    why = "no local node found in " + dir + " (start one, or name a member with --peer HOST:PORT)";
    return {};
  }
  return target;
}

struct StatusClient::Impl {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work =
      boost::asio::make_work_guard(io);
  std::thread thread;
  std::shared_ptr<transport::Host> host;
};

StatusClient::StatusClient(std::optional<transport::SwarmKey> key)
    : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([io = &impl_->io] { io->run(); });
  transport::HostOptions ho;
  ho.listen = "";  // a client only
  ho.swarm_key = std::move(key);
  impl_->host = transport::Host::create(impl_->io, transport::Identity::generate(), ho);
}

StatusClient::~StatusClient() {
  impl_->host->shutdown();
  transport::quiesce_worker_pool();
  impl_->work.reset();
  impl_->io.stop();
  impl_->thread.join();
}

transport::Result<std::vector<std::uint8_t>> StatusClient::call(const std::string& target,
                                                                const std::string& method,
                                                                const std::string& body,
                                                                std::chrono::milliseconds timeout) {
  transport::Rendezvous<transport::Result<transport::Payload>> answer;
  impl_->host->request(
      transport::PeerRef::at(target), method,
      transport::Bytes::copy_of({reinterpret_cast<const std::uint8_t*>(body.data()), body.size()}),
      transport::Duration(timeout.count()), answer.callback());
  // (The request's own deadline answers by `timeout`; five seconds more cover the strand.)
  auto res = answer.wait_for(timeout + std::chrono::seconds(5))
                 .value_or(transport::make_error_code(transport::errc::timed_out));
  if (!res) return res.failure();
  const auto b = res->bytes();
  return std::vector<std::uint8_t>(b.begin(), b.end());
}

transport::Result<std::vector<MemberStatus>> StatusClient::swarm_status(
    const std::string& target, std::chrono::milliseconds timeout) {
  auto bytes = call(target, "swarm_status", "", timeout);
  if (!bytes) return bytes.failure();
  return decode_status(*bytes);
}

}  // namespace grove::node

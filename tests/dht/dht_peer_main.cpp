// dht_peer: one DHT node in its own process, for the integration tests (tests/dht/
// integration_test.cpp). It joins a run and reports on stdout, one line each:
//   ready <id-hex> <address>      after start
//   view <n>                      whenever the live member count changes
//   put <name> <acked>            answer to "put <name> <value>"
//   got <name> <value|->          answer to "get <name>"
//   table <n>                     answer to "table"
// --lan SWARM turns on Avahi discovery (no --peer needed on a LAN).
// Commands come on stdin; end of input or "quit" stops the node.
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <iostream>
#include <thread>

#include "dht/lan_discovery.hpp"
#include "dht/runtime.hpp"

using namespace grove;

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0", state, run = "itest", lan;
  std::vector<std::string> peers;
  long ttl_ms = 3000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dht_peer: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--listen")
      listen = next();
    else if (a == "--peer")
      peers.push_back(next());
    else if (a == "--state")
      state = next();
    else if (a == "--run")
      run = next();
    else if (a == "--ttl-ms")
      ttl_ms = std::stol(next());
    else if (a == "--lan")
      lan = next();
    else {
      std::fprintf(stderr, "dht_peer: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  boost::asio::io_context io;
  transport::HostOptions ho;
  ho.listen = listen;
  auto ident =
      state.empty() ? transport::Identity::generate() : transport::Identity::load_or_create(state);
  auto host = transport::Host::create(io, ident, ho);
  dht::DhtOptions dopts;
  auto rt = dht::DhtRuntime::create(host, dopts, std::random_device{}());
  host->start();
  rt->start();
  auto say = [](const std::string& line) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  };
  dht::MembershipOptions mo;
  mo.ttl = dht::Time(ttl_ms);
  mo.publish_every = dht::Time(ttl_ms / 3);
  mo.poll_every = dht::Time(ttl_ms / 4);
  dht::MemberInfo self;
  self.addresses = {host->address()};
  self.status = "training";
  auto members = rt->join(run, mo, self);
  auto last = std::make_shared<std::size_t>(0);
  // The watcher holds the membership weakly (it is stored inside it).
  rt->post([weak = std::weak_ptr<dht::Membership>(members), last, say](dht::DhtNode&, dht::Time) {
    auto m = weak.lock();
    if (!m) return;
    m->watch([weak, last, say](dht::MemberEvent, const dht::MemberInfo&) {
      auto m = weak.lock();
      if (!m) return;
      const std::size_t n = m->size();
      if (n != *last) say("view " + std::to_string(*last = n));
    });
  });
  if (!peers.empty()) rt->bootstrap(peers);
  std::unique_ptr<dht::LanDiscovery> discovery;
  if (!lan.empty()) discovery = dht::discover_on_lan(rt, *host, lan);
  say("ready " + dht::hex(host->id()) + " " + host->address());

  auto work = boost::asio::make_work_guard(io);
  std::thread input([&] {
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      std::string cmd, name, value;
      in >> cmd >> name >> value;
      if (cmd == "quit") break;
      if (cmd == "put") {
        rt->put_signed(
            dht::key_of(name), "", static_cast<std::uint64_t>(dht::DhtRuntime::wall_now().count()),
            dht::Time(600'000), {value.begin(), value.end()},
            [say, name](dht::PutResult r) { say("put " + name + " " + std::to_string(r.acked)); });
      } else if (cmd == "get") {
        rt->get(dht::key_of(name), [say, name](dht::GetResult r) {
          say("got " + name + " " +
              (r.records.empty()
                   ? "-"
                   : std::string(r.records.back().value.begin(), r.records.back().value.end())));
        });
      } else if (cmd == "table") {
        rt->post([say](dht::DhtNode& n, dht::Time) {
          say("table " + std::to_string(n.table().size()));
        });
      }
    }
    // Leave the run (others drop us at their next poll), then stop; at most 3 s for the leave.
    auto stopped = std::make_shared<bool>(false);
    auto stop = [&, stopped] {
      if (std::exchange(*stopped, true)) return;
      discovery.reset();
      rt->stop();
      host->shutdown();
      work.reset();
    };
    auto deadline = std::make_shared<boost::asio::steady_timer>(io, std::chrono::seconds(3));
    deadline->async_wait([stop, deadline](boost::system::error_code) {
      boost::asio::post(deadline->get_executor(), stop);
    });
    rt->post([&, stop, deadline](dht::DhtNode&, dht::Time now) {
      members->leave(now, [stop, deadline] {
        deadline->cancel();
        boost::asio::post(deadline->get_executor(), stop);
      });
    });
  });
  io.run();
  input.join();
  transport::quiesce_worker_pool();
  return 0;
}

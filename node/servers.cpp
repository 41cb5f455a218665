#include "node/servers.hpp"

#include <algorithm>
#include <charconv>

#include "dht/runtime.hpp"
#include "gossip/progress.hpp"
#include "node/config.hpp"

namespace grove::node {

StatusBoard::StatusBoard(std::string node) {
  me_.node = std::move(node);
  me_.status = "starting";
}

void StatusBoard::update(const std::function<void(MemberStatus&)>& fn) {
  std::lock_guard lk(mu_);
  fn(me_);
}

void StatusBoard::set_checkpointing(bool on) {
  std::lock_guard lk(mu_);
  checkpointing_ = on;
}

MemberStatus StatusBoard::read() const {
  std::lock_guard lk(mu_);
  MemberStatus m = me_;
  if (checkpointing_ && m.status == "training") m.status = "checkpointing";
  m.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return m;
}

Servers::Servers(std::shared_ptr<transport::Host> host, std::shared_ptr<const StatusBoard> board)
    : host_(std::move(host)), board_(std::move(board)) {
  serve_status();
  serve_requests();
}

MemberStatus Servers::self(const StatusBoard& board, const ServedStack& stack,
                           const transport::Host& host) {
  MemberStatus m = board.read();
  if (stack.address) m.address = stack.address();
  const auto st = host.stats();
  m.bytes_sent = st.bytes_sent;
  m.bytes_received = st.bytes_received;
  return m;
}

// "status": this node. "swarm_status": every live member of the run, each asked "status" in
// parallel (3 s each); a member that does not answer is listed from its member record.
void Servers::serve_status() {
  host_->handle("status",
                [host = host_.get(), board = board_, stack = stack_](
                    const transport::PeerInfo&, transport::Payload, transport::Responder r) {
                  r.reply(encode_status({self(*board, *stack, *host)}));
                });
  host_->handle(
      "swarm_status", [host = host_.get(), board = board_, stack = stack_](
                          const transport::PeerInfo&, transport::Payload, transport::Responder r) {
        // The host strand is the DHT's strand: the member view can be read here.
        const auto live = stack->members ? stack->members->live(dht::DhtRuntime::wall_now())
                                         : std::vector<dht::MemberInfo>{};
        struct Gather {
          std::mutex mu;
          std::vector<MemberStatus> out;
          std::size_t left = 0;
          std::optional<transport::Responder> responder;
          void done() {
            if (--left > 0) return;
            std::sort(out.begin(), out.end(),
                      [](const MemberStatus& a, const MemberStatus& b) { return a.node < b.node; });
            responder->reply(encode_status(out));
          }
        };
        auto g = std::make_shared<Gather>();
        g->responder.emplace(std::move(r));
        g->out.push_back(self(*board, *stack, *host));
        g->left = 1;
        for (const auto& m : live) {
          if (m.id == host->id()) continue;
          ++g->left;
          // A member without addresses accepts no connections: it answers if it has one open to us.
          const std::string addr = m.addresses.empty() ? std::string() : m.addresses.front();
          MemberStatus fallback;
          fallback.node = transport::to_hex(m.id).substr(0, 16);
          fallback.address = addr;
          fallback.status = "unreachable";
          fallback.run = m.run_id;
          fallback.round = gossip::progress_of(m).round;
          fallback.reachable = false;
          host->request(transport::PeerRef::node(m.id, addr), "status", transport::Bytes(),
                        transport::Duration(3000),
                        [g, fallback](transport::Result<transport::Payload> res) {
                          std::optional<std::vector<MemberStatus>> got;
                          if (res) {
                            if (auto d = decode_status(res->bytes())) got = std::move(*d);
                          }
                          std::lock_guard lk(g->mu);
                          g->out.push_back(got && got->size() == 1 ? got->front() : fallback);
                          g->done();
                        });
        }
        std::lock_guard lk(g->mu);
        g->done();
      });
}

// "request_mode": body = "diloco" or "noloco", optionally followed by " <round>". The node signs
// the request record (a client that is not a member cannot) and answers with the round it names.
void Servers::serve_requests() {
  host_->handle("request_mode", [stack = stack_](const transport::PeerInfo&,
                                                 transport::Payload body, transport::Responder r) {
    const auto b = body.bytes();
    const std::string text(reinterpret_cast<const char*>(b.data()),
                           std::min<std::size_t>(b.size(), 64));
    const auto sp = text.find(' ');
    const auto mode = parse_mode(text.substr(0, sp));
    std::optional<std::uint64_t> from;
    if (sp != std::string::npos) {
      std::uint64_t v = 0;
      const auto rest = text.substr(sp + 1);
      const auto res = std::from_chars(rest.data(), rest.data() + rest.size(), v);
      if (res.ec != std::errc() || res.ptr != rest.data() + rest.size())
        return r.fail(transport::errc::rejected, "bad round in the request");
      from = v;
    }
    if (!mode) return r.fail(transport::errc::rejected, "expected diloco or noloco");
    if (!stack->round) return r.fail(transport::errc::rejected, "the node is still starting");
    auto holder = std::make_shared<std::optional<transport::Responder>>(std::move(r));
    stack->round->request_mode(*mode, from, [holder](transport::Result<std::uint64_t> res) {
      if (!*holder) return;
      if (!res) return (*holder)->fail(transport::errc::remote_error, res.error().message());
      const std::string a = std::to_string(*res);
      (*holder)->reply({reinterpret_cast<const std::uint8_t*>(a.data()), a.size()});
    });
  });
}

}  // namespace grove::node

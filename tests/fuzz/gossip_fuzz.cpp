// Fuzz target for the gossip wire codec (gossip/wire.hpp) and the averaging cores that consume
// it (gossip/allreduce.hpp, gossip/exchange.hpp). Input layout: gossip_fuzz.hpp.
//
// A persistent RingAllReduce, GroupExchange and three RingAllGathers (top-k, 2-bit top-k, E3M0)
// receive every input that decodes as a message
// from the selected peer; every 8 inputs the harness advances the clock 700 ms and fires their
// timers. A core that has finished is replaced by a fresh one (and both are every 5000 inputs).
// Properties checked (a violation traps):
//   - decode_message never crashes; what it accepts re-encodes to bytes that decode to the same
//     header and payload;
//   - a receiving and a sending Transfer (grove.recv / grove.send) get every message from peer 0
//     too: a received tensor that completes has the size asked for and is finite;
//   - a StepGroup (the per-step collectives' views) gets every message too and begins and ends a
//     call every few inputs: every view it begins is sorted, names itself, repeats nobody and
//     stays within its size limit;
//   - everything a core sends decodes, carries the core's op, and goes to a member of its group;
//   - a finished all-reduce's or all-gather's result and an exchange's means have the tensor's
//     size and are finite (nothing received can put a NaN into the model);
//   - selector bit 3 set: the bytes go to the DHT-record and state-sync decoders instead
//     (decode_ready, dht's decode_member, decode_progress, decode_mode, decode_offer,
//     decode_state_request, decode_probe, decode_probe_answer, decode_manifest, StateServer::answer
//     (chunk requests and probes) and a StateDownload's response handler); what they accept
//     re-encodes to the same value, and a probe answer's samples are finite. The bytes are also
//     read as a state delta (read_delta_header, and replay_delta onto a small state from the
//     delta's own `from`): what it applies leaves φ finite.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "dht/membership.hpp"
#include "gossip/allgather.hpp"
#include "gossip/allreduce.hpp"
#include "gossip/exchange.hpp"
#include "gossip/matchmaking.hpp"
#include "gossip/mode.hpp"
#include "gossip/progress.hpp"
#include "gossip/state_check.hpp"
#include "gossip/state_delta.hpp"
#include "gossip/state_sync.hpp"
#include "gossip/step_group.hpp"
#include "gossip/step_work.hpp"
#include "gossip/transfer.hpp"
#include "tests/fuzz/gossip_fuzz.hpp"

namespace {
using namespace grove;
using namespace grove::fuzz::gossip_fuzz;
using gossip::Time;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

struct State {
  Time now{0};
  std::size_t inputs = 0;
  std::unique_ptr<gossip::RingAllReduce> ring;
  std::unique_ptr<gossip::GroupExchange> exchange;
  std::unique_ptr<gossip::RingAllGather> gather[kGathers];
  std::unique_ptr<gossip::StepGroup> group;
  std::unique_ptr<gossip::Transfer> recv, send;

  void fresh_transfers() {
    gossip::TransferOptions o;
    o.chunk_values = kChunk;
    recv = gossip::Transfer::receive(op(), peer(0), optim::Floats(kRingValues, 0.0f), o, now);
    send = gossip::Transfer::send(op(), peer(0), optim::Floats(kRingValues, 0.25f), o, now);
  }

  void fresh_ring() {
    gossip::AllReduceOptions o;
    o.chunk_values = kChunk;
    std::vector<float> in(kRingValues);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = 0.001f * static_cast<float>(i % 97);
    ring = gossip::RingAllReduce::create(op(), peer(1), std::vector{peer(0), peer(1), peer(2)},
                                         std::move(in), o, now)
               .value();
  }
  void fresh_gather(int i) {
    gossip::AllGatherOptions o;
    o.codec = gather_codec(i);
    o.piece_values = kChunk;
    std::vector<float> in(kRingValues);
    for (std::size_t k = 0; k < in.size(); ++k) in[k] = 0.002f * static_cast<float>(k % 89) - 0.05f;
    gather[i] = gossip::RingAllGather::create(op(), peer(1), std::vector{peer(0), peer(1), peer(2)},
                                              std::move(in), o, now)
                    .value();
  }
  void fresh_exchange() {
    gossip::ExchangeOptions o;
    o.codec = gossip::WireCodec::fp32;
    o.chunk_values = kChunk;
    std::vector<float> t(kExchangeValues);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f - 0.001f * static_cast<float>(i);
    exchange = gossip::GroupExchange::create(op(), peer(1), std::vector{peer(1), peer(0)},
                                             std::vector<std::vector<float>>{t}, o, now)
                   .value();
  }
};

void drain(gossip::Protocol& p, std::initializer_list<int> members) {
  for (auto& o : p.take_outgoing()) {
    auto m = gossip::decode_message(o.data.span());
    check(static_cast<bool>(m));
    check(m->h.op == p.op());
    check(std::any_of(members.begin(), members.end(), [&](int i) { return peer(i) == o.to; }));
  }
}

void check_results(State& s) {
  if (s.ring->finished()) {
    if (s.ring->status() == gossip::OpStatus::done) {
      check(s.ring->result().size() == kRingValues);
      check(optim::all_finite(s.ring->result()));
    }
    s.fresh_ring();
  }
  for (int i = 0; i < kGathers; ++i) {
    if (!s.gather[i]->finished()) continue;
    if (s.gather[i]->status() == gossip::OpStatus::done) {
      check(s.gather[i]->result().size() == kRingValues);
      check(optim::all_finite(s.gather[i]->result()));
    }
    s.fresh_gather(i);
  }
  if (s.recv->finished() || s.send->finished()) {
    if (s.recv->status() == gossip::OpStatus::done) {
      const auto r = s.recv->take_result();
      check(r.size() == kRingValues && optim::all_finite(r));
    }
    s.fresh_transfers();
  }
  if (s.exchange->finished()) {
    check(s.exchange->mean().size() == 1 && s.exchange->mean()[0].size() == kExchangeValues);
    check(optim::all_finite(s.exchange->mean()[0]));
    s.fresh_exchange();
  }
}

void records(std::span<const std::uint8_t> bytes) {
  if (auto r = gossip::decode_ready(bytes))
    check(gossip::decode_ready(gossip::encode_ready(*r)).value() == *r);
  if (auto m = dht::decode_member(bytes))
    check(dht::decode_member(dht::encode_member(*m)).value() == *m);
  if (auto p = gossip::decode_progress(bytes))
    check(gossip::decode_progress(gossip::encode_progress(*p)).value() == *p);
  if (auto m = gossip::decode_mode(bytes))
    check(gossip::decode_mode(gossip::encode_mode(*m)).value() == *m);
  if (auto o = gossip::decode_offer(bytes))
    check(gossip::decode_offer(gossip::encode_offer(*o)).value() == *o);
  if (auto q = gossip::decode_state_request(bytes)) {
    auto back = gossip::decode_state_request(gossip::encode_state_request(*q));
    check(back && back->root == q->root && back->index == q->index);
  }
  if (auto p = gossip::decode_probe(bytes)) {
    auto back = gossip::decode_probe(gossip::encode_probe(*p));
    check(back && back->round == p->round && back->seed == p->seed && back->samples == p->samples);
    check(p->samples <= gossip::kProbeSamples);
  }
  if (auto a = gossip::decode_probe_answer(bytes)) {
    check(a->samples.size() <= gossip::kProbeSamples);
    for (const float f : a->samples) check(std::isfinite(f));
    auto back = gossip::decode_probe_answer(gossip::encode_probe_answer(*a));
    check(back && back->hash == a->hash && back->samples == a->samples);
  }
  if (auto m = gossip::decode_manifest(bytes, 64)) {
    check(m->chunks.size() <= 64);
    check(gossip::encode_manifest(*m).size() <= bytes.size() + 64);
  }
  static const auto server = [] {
    auto s = std::make_unique<gossip::StateServer>();
    s->add(std::make_shared<gossip::StateSnapshot>("fuzz", 1, std::vector<std::uint8_t>(1000, 7),
                                                   256));
    s->note_hash(1, gossip::Digest{1, 2, 3});
    return s;
  }();
  (void)server->answer(bytes);
  // A download fed the input as the donor's first answer (the manifest) and as a chunk.
  auto snap = server->latest();
  gossip::StateDownload d("fuzz", {{peer(0), "a:1", "fuzz", 1, 1000, snap->root(), {}}}, {},
                          Time(0));
  auto reqs = d.take_requests();
  check(reqs.size() == 1);
  d.on_response(reqs[0].id, bytes, Time(1));
  check(d.status() != gossip::OpStatus::done);  // only the real manifest hashes to the root
  gossip::StateDownload d2("fuzz", {{peer(0), "a:1", "fuzz", 1, 1000, snap->root(), {}}}, {},
                           Time(0));
  auto r2 = d2.take_requests();
  d2.on_response(r2[0].id, snap->manifest_bytes(), Time(1));
  for (auto& r : d2.take_requests()) d2.on_response(r.id, bytes, Time(2));
  if (d2.status() == gossip::OpStatus::done) {
    auto blob = d2.take_blob();
    std::vector<std::uint8_t> got(blob ? blob->size() : 0);
    check(blob && blob->read(0, got) && got == std::vector<std::uint8_t>(1000, 7));
  }
  const auto delta = gossip::memory_blob({bytes.begin(), bytes.end()});
  if (auto h = gossip::read_delta_header(*delta); h && h->values <= 4096) {
    optim::OuterState st;
    st.round = h->round - 1;
    st.phi = std::vector<float>(h->values, 0.5f);
    st.momentum = std::vector<float>(h->values, 0.0f);
    gossip::Digest at = h->from;  // (the fuzzer cannot make a real hash: start from the delta's)
    const auto r = gossip::replay_delta(*delta, st, at, {});
    check(optim::all_finite(st.phi) && optim::all_finite(st.momentum));
    if (r) check(st.round == h->round && at == h->to);
  }
}

// Begins a call when none is in progress, ends it (with its whole view) on the next input.
void step_group(State& s) {
  auto& g = *s.group;
  if (auto d = g.next_deadline(); d && *d <= s.now) g.on_timer(s.now);
  if (g.in_call()) {
    g.end(true, g.view(), s.now);
  } else if (auto cv = g.begin(s.now)) {
    const auto& v = cv->members;
    check(!v.empty() && v.size() <= 256 && cv->rank < v.size() && v[cv->rank] == peer(1));
    for (std::size_t i = 1; i < v.size(); ++i) check(v[i - 1] < v[i]);
  }
  for (auto& o : g.take_outgoing()) check(static_cast<bool>(gossip::decode_message(o.data.span())));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static State s = [] {
    spdlog::set_level(spdlog::level::off);
    State st;
    st.fresh_ring();
    st.fresh_exchange();
    st.fresh_transfers();
    for (int i = 0; i < kGathers; ++i) st.fresh_gather(i);
    st.group = std::make_unique<gossip::StepGroup>(op(), peer(1));
    st.group->set_candidates({peer(0), peer(2)}, st.now);
    return st;
  }();
  if (++s.inputs % 5000 == 0) {
    s.fresh_ring();
    s.fresh_exchange();
    s.fresh_transfers();
    for (int i = 0; i < kGathers; ++i) s.fresh_gather(i);
  }
  if (size == 0) return 0;
  const std::uint8_t sel = data[0];
  const std::span<const std::uint8_t> bytes(data + 1, size - 1);
  if (sel & 8) {
    records(bytes);
    return 0;
  }
  auto m = gossip::decode_message(bytes);
  if (m) {
    const gossip::Bytes again = gossip::encode_message(m->h, m->payload.size());
    std::span<std::uint8_t> payload;
    gossip::Bytes copy = gossip::encode_message(m->h, m->payload.size(), &payload);
    if (!m->payload.empty()) std::memcpy(payload.data(), m->payload.data(), m->payload.size());
    auto back = gossip::decode_message(copy.span());
    check(static_cast<bool>(back));
    check(back->h.kind == m->h.kind && back->h.op == m->h.op && back->h.tag == m->h.tag &&
          back->h.index == m->h.index && back->h.chunk == m->h.chunk &&
          back->h.count == m->h.count && back->h.codec == m->h.codec &&
          back->h.digest == m->h.digest && back->h.suspects == m->h.suspects &&
          back->h.view == m->h.view);
    check(std::equal(back->payload.begin(), back->payload.end(), m->payload.begin(),
                     m->payload.end()));
    check(again.size() == copy.size());
    const gossip::NodeId from = (sel & 3) == 3 ? gossip::NodeId{0xee} : peer(sel & 3);
    if (sel & 4)
      s.exchange->on_message(from, *m, s.now);
    else if (sel & 16)
      s.gather[(sel >> 5) % kGathers]->on_message(from, *m, s.now);
    else
      s.ring->on_message(from, *m, s.now);
    s.group->on_message(from, *m, s.now);
    s.recv->on_message(from, *m, s.now);
    s.send->on_message(from, *m, s.now);
  }
  step_group(s);
  if (s.inputs % 8 == 0) {
    s.now += Time(700);
    s.ring->on_timer(s.now);
    s.exchange->on_timer(s.now);
    for (auto& g : s.gather) g->on_timer(s.now);
    s.recv->on_timer(s.now);
    s.send->on_timer(s.now);
  }
  drain(*s.ring, {0, 2});
  drain(*s.exchange, {0});
  for (auto& g : s.gather) drain(*g, {0, 2});
  drain(*s.recv, {0});
  drain(*s.send, {0});
  check_results(s);
  return 0;
}

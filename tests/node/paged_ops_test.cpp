// A round's averaging over the node's pages: the DiLoCo all-reduce and the NoLoCo exchange of
// model-sized arrays (paged as the node pages them) hold their window of messages and a few
// chunks in memory, not the arrays or their encodings, and still compute the mean.
#include <gtest/gtest.h>

#include <malloc.h>

#include <functional>
#include <map>

#include "gossip/allreduce.hpp"
#include "gossip/exchange.hpp"
#include "node/state_files.hpp"
#include "tests/node/rss.hpp"
#include "tests/node/temp_dir.hpp"

namespace grove::node {
namespace {

using gossip::NodeId;
using gossip::Protocol;
using testing::PeakRss;
using testing::rss_now;
using testing::sanitized;

constexpr std::size_t kValues = 32u << 20;  // 128 MiB per array
constexpr std::uint64_t kMiB = 1u << 20;
// What the cores may hold: their windows (each member: 32 messages of its own and 32 it passes
// on, of 512 KiB in fp16), and a fragment of two arrays for a pass that walks them together (the
// exchange's norm and mean).
constexpr std::uint64_t kWindows = 2 * 64 * kMiB / 2;
constexpr std::uint64_t kPass = 2 * optim::kFragment * sizeof(float);
constexpr std::uint64_t kSlack = 16 * kMiB;

// As grove-node does (node/main.cpp): buffers above 256 KiB are mappings of their own, returned
// when freed, so that freed messages do not stay resident in the heap.
void as_the_node_does() {
  ::mallopt(M_MMAP_THRESHOLD, 256 << 10);
}

float value(std::size_t member, std::size_t i) {
  return static_cast<float>((i + 7 * member) % 1000) / 1000.0f - 0.5f;
}

optim::Floats filled(std::size_t member, const optim::FloatAllocator& alloc) {
  auto f = optim::Floats::zeros(kValues, alloc);
  optim::by_fragments(kValues,
                      [&](std::size_t lo, std::size_t hi) {
                        for (std::size_t i = lo; i < hi; ++i) f[i] = value(member, i);
                      },
                      {&f});
  return f;
}

// Runs the members' cores to the end, handing each message over at once and telling its sender
// that it left (what the runtime does when the stream completes).
void run(std::map<NodeId, Protocol*> members) {
  for (int guard = 0; guard < 1'000'000; ++guard) {
    bool moved = false, all_done = true;
    for (auto& [id, p] : members) {
      for (auto& out : p->take_outgoing()) {
        moved = true;
        const auto data = std::move(out.data);  // freed once handed over, as a stream's buffer
        auto m = gossip::decode_message(data.span());
        ASSERT_TRUE(m);
        members.at(out.to)->on_message(id, *m, dht::Time(1));
        p->on_delivered(out.to, dht::Time(1));
      }
      all_done = all_done && p->finished();
    }
    if (all_done || !moved) return;
  }
}

// Two members (a, b) whose arrays are in pages of a temporary state directory.
class PagedOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (sanitized()) GTEST_SKIP() << "the sanitizers' allocators keep freed memory resident";
    as_the_node_does();
    a[0] = 1;
    b[0] = 2;
  }
  testing::TempDir d{"grove-paged-"};
  optim::FloatAllocator alloc = float_pages(d.path / "blobs");
  NodeId a{}, b{};
  gossip::OpId op{};
};

TEST_F(PagedOps, AnAllReduceOfPagedArraysHoldsAWindowNotTheModel) {
  gossip::AllReduceOptions o;
  o.alloc = alloc;
  auto in_a = filled(0, alloc), in_b = filled(1, alloc);
  ASSERT_TRUE(in_a.paged() && in_b.paged());
  const std::uint64_t base = rss_now();
  PeakRss peak;
  auto ra = gossip::RingAllReduce::create(op, a, {a, b}, std::move(in_a), o, dht::Time(0)).value();
  auto rb = gossip::RingAllReduce::create(op, b, {a, b}, std::move(in_b), o, dht::Time(0)).value();
  run({{a, ra.get()}, {b, rb.get()}});
  const std::uint64_t grew = peak.stop() - base;
  ASSERT_EQ(ra->status(), gossip::OpStatus::done) << ra->failure();
  ASSERT_EQ(rb->status(), gossip::OpStatus::done) << rb->failure();
  // Inputs and results: 4 × 128 MiB in the pages (the inputs on the heap, or a member's segment
  // encoded at once, would be 128 or 32 MiB more).
  EXPECT_LT(grew, kWindows + kSlack) << "resident memory grew by " << grew << " bytes";
  const auto& r = ra->result();
  ASSERT_TRUE(r.paged());
  for (std::size_t i : {std::size_t{0}, std::size_t{4321}, kValues / 2 + 3, kValues - 1}) {
    EXPECT_NEAR(r[i], (value(0, i) + value(1, i)) / 2, 1e-3) << i;
    EXPECT_EQ(r[i], rb->result()[i]) << "every member holds the same bits";
  }
}

TEST_F(PagedOps, AnExchangeOfPagedArraysHoldsAWindowNotTheModel) {
  gossip::ExchangeOptions o;
  o.alloc = alloc;  // partners' tensors are staged in pages too
  std::vector<optim::Floats> ta, tb;
  ta.push_back(filled(0, alloc));
  tb.push_back(filled(1, alloc));
  const std::uint64_t base = rss_now();
  PeakRss peak;
  auto ea = gossip::GroupExchange::create(op, a, {a, b}, std::move(ta), o, dht::Time(0)).value();
  auto eb = gossip::GroupExchange::create(op, b, {a, b}, std::move(tb), o, dht::Time(0)).value();
  run({{a, ea.get()}, {b, eb.get()}});
  const std::uint64_t grew = peak.stop() - base;
  ASSERT_TRUE(ea->finished() && eb->finished());
  ASSERT_EQ(ea->completed().size(), 1u);
  ASSERT_EQ(eb->completed().size(), 1u);
  // Tensors and staging: 4 × 128 MiB in the pages; their fp16 encodings, made at once, would be
  // 2 × 64 MiB.
  EXPECT_LT(grew, kPass + kWindows + kSlack) << "resident memory grew by " << grew << " bytes";
  const auto& m = ea->mean()[0];
  ASSERT_TRUE(m.paged());
  for (std::size_t i : {std::size_t{0}, std::size_t{4321}, kValues / 2 + 3, kValues - 1})
    EXPECT_NEAR(m[i], (value(0, i) + value(1, i)) / 2, 1e-3) << i;
}

// A trio (an odd member joins a pair): each member's mean is folded chunk by chunk as its two
// partners' tensors arrive, in pages as well; nothing of the model is resident at once.
TEST_F(PagedOps, ATrioExchangeOfPagedArraysHoldsItsWindowsNotTheModel) {
  gossip::ExchangeOptions o;
  o.alloc = alloc;
  NodeId c{};
  c[0] = 3;
  std::vector<optim::Floats> ta, tb, tc;
  ta.push_back(filled(0, alloc));
  tb.push_back(filled(1, alloc));
  tc.push_back(filled(2, alloc));
  const std::uint64_t base = rss_now();
  PeakRss peak;
  const std::vector<NodeId> group{a, b, c};
  auto ea = gossip::GroupExchange::create(op, a, group, std::move(ta), o, dht::Time(0)).value();
  auto eb = gossip::GroupExchange::create(op, b, group, std::move(tb), o, dht::Time(0)).value();
  auto ec = gossip::GroupExchange::create(op, c, group, std::move(tc), o, dht::Time(0)).value();
  run({{a, ea.get()}, {b, eb.get()}, {c, ec.get()}});
  const std::uint64_t grew = peak.stop() - base;
  ASSERT_TRUE(ea->finished() && eb->finished() && ec->finished());
  ASSERT_EQ(ea->completed().size(), 2u);
  EXPECT_TRUE(ea->mean_streamed());
  // Tensors, staging and the folded means: 9 × 128 MiB in the pages; each member's two streams
  // hold their windows (3 × 2 × 32 messages of 512 KiB at most).
  EXPECT_LT(grew, kPass + 3 * kWindows / 2 + kSlack)
      << "resident memory grew by " << grew << " bytes";
  const auto& m = ea->mean()[0];
  ASSERT_TRUE(m.paged());
  for (std::size_t i : {std::size_t{0}, std::size_t{4321}, kValues / 2 + 3, kValues - 1})
    EXPECT_NEAR(m[i], (value(0, i) + value(1, i) + value(2, i)) / 3, 1e-3) << i;
}

}  // namespace
}  // namespace grove::node

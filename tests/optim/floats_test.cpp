// Floats: heap semantics like a vector's, pages kept by moves and by same-size copies, and the
// fragment walk releasing what it touched.
#include "optim/floats.hpp"

#include <gtest/gtest.h>

#include <utility>

namespace grove::optim {
namespace {

using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

// Pages on the heap that record what was released (and prefetched).
struct Recorded final : FloatPages {
  std::vector<float> v;
  Ranges* released;
  Ranges* prefetched;
  Recorded(std::size_t n, Ranges* r, Ranges* p = nullptr)
      : v(n, 0.0f), released(r), prefetched(p) {}
  float* data() override { return v.data(); }
  std::size_t size() const override { return v.size(); }
  void release(std::size_t lo, std::size_t hi) override { released->emplace_back(lo, hi); }
  void prefetch(std::size_t lo, std::size_t hi) override {
    if (prefetched) prefetched->emplace_back(lo, hi);
  }
};

TEST(Floats, OnTheHeapItBehavesLikeAVector) {
  Floats a{1.0f, 2.0f, 3.0f};
  EXPECT_FALSE(a.paged());
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  Floats b = a;
  b[0] = 9;
  EXPECT_EQ(a[0], 1.0f) << "a copy is deep";
  const float* storage = b.data();
  Floats c = std::move(b);
  EXPECT_EQ(c.data(), storage) << "a move keeps the storage";
  EXPECT_TRUE(b.empty());
  auto v = c.take_vector();
  EXPECT_EQ(v.data(), storage) << "the heap storage itself comes out";
  EXPECT_TRUE(c.empty());
  c.assign(4, 0.5f);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
  c.release();  // nothing to do on the heap
  std::span<const float> s = c;
  EXPECT_EQ(s.size(), 4u);
}

TEST(Floats, PagesAreKeptByMovesAndSameSizeCopiesAndReleasedByFragment) {
  Ranges released;
  const std::size_t n = 2 * kFragment + 5;
  const FloatAllocator alloc = [&](std::size_t k) {
    return std::make_unique<Recorded>(k, &released);
  };
  Floats p = Floats::zeros(n, alloc);
  ASSERT_TRUE(p.paged());
  EXPECT_EQ(p[n - 1], 0.0f);
  by_fragments(n, [&](std::size_t lo, std::size_t hi) { p[lo] = static_cast<float>(hi); }, {&p});
  EXPECT_EQ(released, (Ranges{{0, kFragment}, {kFragment, 2 * kFragment}, {2 * kFragment, n}}));
  EXPECT_EQ(p[kFragment], static_cast<float>(2 * kFragment));
  Floats moved = std::move(p);
  EXPECT_TRUE(moved.paged());
  Floats heap(n, 1.0f);
  moved = heap;  // same size: the values are copied into the pages
  EXPECT_TRUE(moved.paged());
  EXPECT_EQ(moved, heap);
  Floats copy = moved;
  EXPECT_FALSE(copy.paged()) << "a copy is on the heap";
  released.clear();
  moved.assign(n, 2.0f);  // same size: in the pages, a fragment at a time
  EXPECT_TRUE(moved.paged());
  EXPECT_EQ(released.size(), 3u);
  // No allocator, or one that gives nothing: the heap.
  EXPECT_FALSE(Floats::zeros(10, {}).paged());
  EXPECT_FALSE(Floats::zeros(10, [](std::size_t) { return nullptr; }).paged());
  EXPECT_EQ(Floats::zeros(10, {}), std::vector<float>(10, 0.0f));
}

TEST(Floats, AFragmentWalkPrefetchesTheNextFragmentBeforeWorkingOnOne) {
  Ranges released, prefetched, order;
  const std::size_t n = 2 * kFragment + 5;
  Floats p = Floats::zeros(
      n, [&](std::size_t k) { return std::make_unique<Recorded>(k, &released, &prefetched); });
  by_fragments(n,
               [&](std::size_t lo, std::size_t hi) {
                 order.emplace_back(prefetched.size(),
                                    lo);  // how many prefetches came before this one
                 p[hi - 1] = 1.0f;
               },
               {&p});
  // The next fragment (clipped to the array; none after the last) before each fragment's work.
  EXPECT_EQ(prefetched, (Ranges{{kFragment, 2 * kFragment}, {2 * kFragment, n}}));
  EXPECT_EQ(order, (Ranges{{1, 0}, {2, kFragment}, {2, 2 * kFragment}}));
  p.prefetch(n, n + 10);  // past the end: nothing asked of the pages
  EXPECT_EQ(prefetched.size(), 2u);
  Floats{1.0f, 2.0f}.prefetch(0, 2);  // nothing to do on the heap
}

}  // namespace
}  // namespace grove::optim

#include "gossip/state_blob.hpp"

#include <cstring>

#include "optim/buffer.hpp"

namespace grove::gossip {

using transport::errc;

namespace {
bool in_range(std::uint64_t size, std::uint64_t offset, std::size_t n) {
  return offset <= size && n <= size - offset;
}

class MemoryBlob final : public StateBlob {
 public:
  explicit MemoryBlob(optim::ByteBuffer b) : b_(std::move(b)) {}
  std::uint64_t size() const override { return b_.size(); }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    if (!in_range(b_.size(), offset, out.size())) return {errc::rejected, "read past the blob"};
    if (!out.empty()) std::memcpy(out.data(), b_.data() + offset, out.size());
    return {};
  }

 private:
  optim::ByteBuffer b_;
};

class MemoryWriter final : public BlobWriter {
 public:
  // Not zeroed: pages are faulted in as they are written (a download's chunks, one by one).
  explicit MemoryWriter(std::uint64_t size) { b_.resize(static_cast<std::size_t>(size)); }
  std::uint64_t size() const override { return b_.size(); }
  transport::Result<void> write(std::uint64_t offset, std::span<const std::uint8_t> d) override {
    if (!in_range(b_.size(), offset, d.size())) return {errc::rejected, "write past the blob"};
    if (!d.empty()) std::memcpy(b_.data() + offset, d.data(), d.size());
    return {};
  }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    if (!in_range(b_.size(), offset, out.size())) return {errc::rejected, "read past the blob"};
    if (!out.empty()) std::memcpy(out.data(), b_.data() + offset, out.size());
    return {};
  }
  std::shared_ptr<const StateBlob> seal() override {
    return std::make_shared<const MemoryBlob>(std::move(b_));
  }

 private:
  optim::ByteBuffer b_;
};

class MemoryStore final : public BlobStore {
 public:
  transport::Result<std::unique_ptr<BlobWriter>> create(std::uint64_t size) override {
    if (size > std::uint64_t{PTRDIFF_MAX}) return {errc::rejected, "blob too large"};
    return std::unique_ptr<BlobWriter>(std::make_unique<MemoryWriter>(size));
  }
};
}  // namespace

std::shared_ptr<BlobStore> memory_blob_store() {
  return std::make_shared<MemoryStore>();
}

std::shared_ptr<const StateBlob> memory_blob(std::vector<std::uint8_t> bytes) {
  return std::make_shared<const MemoryBlob>(optim::ByteBuffer(bytes.begin(), bytes.end()));
}

transport::Result<std::shared_ptr<const StateBlob>> save_state(BlobStore& store,
                                                               const optim::OuterState& s) {
  auto w = store.create(optim::serialized_size(s));
  if (!w) return w.failure();
  std::uint64_t at = 0;
  transport::Result<void> failed;
  optim::serialize_to(s, [&](std::span<const std::uint8_t> piece) {
    failed = (*w)->write(at, piece);
    at += piece.size();
    return static_cast<bool>(failed);
  });
  if (!failed) return failed.failure();
  return (*w)->seal();
}

std::optional<optim::OuterState> load_state(const StateBlob& blob, std::size_t max_values,
                                            const optim::FloatAllocator& alloc) {
  return optim::deserialize_from(
      blob.size(),
      [&](std::uint64_t offset, std::span<std::uint8_t> out) {
        return static_cast<bool>(blob.read(offset, out));
      },
      max_values, alloc);
}

}  // namespace grove::gossip

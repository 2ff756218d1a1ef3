// A cache of large CPU memory blocks under torch's CPU allocator, so that the temporaries a prefill makes
// again at every layer and every step (a chunk's activations, a projection's output) reuse memory that is
// already resident instead of faulting fresh pages in.
//
// Without it, every tensor of 1 MiB or more is its own mmap (engine/core/memory.py fixes glibc's threshold there,
// which keeps a server's heap from growing), and each one pays its page faults again: on the 8B file a
// 128-token prefill took 3.6 s warm and 6-7 s for the first prompt after loading (on a VM whose balloon takes
// back free pages, fresh memory costs far more than the zeroing), against 2.7-3.0 s with memory kept.
//
// Blocks from kMinBlockBytes up are rounded up to kBlockRounding and, when freed, kept for reuse while the
// cache holds at most `limit` bytes; past that, the least recently freed blocks go back to the system. A
// request takes the smallest cached block that fits and wastes at most a quarter of it. Smaller requests go
// to the allocator that was in place (glibc's heap). The cache never grows the process beyond what its
// tensors used at their peak plus `limit`.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <tuple>
#include <unordered_map>

namespace block_cache {

constexpr size_t kMinBlockBytes = size_t{1} << 20;
constexpr size_t kBlockRounding = size_t{64} << 10;
constexpr size_t kAlignment = 64;  // as torch's default CPU allocator

class BlockCache final : public c10::Allocator {
 public:
  BlockCache(c10::Allocator* fallback, size_t limit) : fallback_(fallback), limit_(limit) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < kMinBlockBytes) return fallback_->allocate(n);
    const size_t size = (n + kBlockRounding - 1) / kBlockRounding * kBlockRounding;
    void* block = take(size);
    if (block == nullptr) {
      if (posix_memalign(&block, kAlignment, size) != 0) throw std::bad_alloc();
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[block] = size;
    }
    return {block, block, &release, c10::Device(c10::DeviceType::CPU)};
  }

  // raw_deallocate's deleter: ours for our blocks, the fallback's for the rest
  c10::DeleterFnPtr raw_deleter() const override { return &release_any; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void set_limit(size_t limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = limit;
    trim(0);
  }

  // (bytes cached now, blocks cached now, requests served from the cache so far)
  std::tuple<int64_t, int64_t, int64_t> stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {static_cast<int64_t>(cached_), static_cast<int64_t>(free_.size()), static_cast<int64_t>(hits_)};
  }

  static BlockCache* instance;

 private:
  struct Cached {
    void* block;
    uint64_t freed_at;  // the release's sequence number: the smallest is the least recently freed
  };

  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(size);
    if (it == free_.end() || it->first > size + size / 4) return nullptr;
    void* block = it->second.block;
    cached_ -= it->first;
    free_.erase(it);
    ++hits_;
    return block;
  }

  static void release(void* block) { instance->put(block); }

  static void release_any(void* block) {
    {
      std::lock_guard<std::mutex> lock(instance->mutex_);
      if (instance->sizes_.count(block) == 0) {
        instance->fallback_->raw_deleter()(block);
        return;
      }
    }
    instance->put(block);
  }

  void put(void* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t size = sizes_.at(block);
    if (size > limit_) {
      drop(block);
      return;
    }
    trim(size);
    free_.emplace(size, Cached{block, ++releases_});
    cached_ += size;
  }

  // Free the least recently freed blocks until `room` more bytes fit under the limit (mutex held).
  void trim(size_t room) {
    while (!free_.empty() && cached_ + room > limit_) {
      auto oldest = free_.begin();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second.freed_at < oldest->second.freed_at) oldest = it;
      }
      cached_ -= oldest->first;
      void* block = oldest->second.block;
      free_.erase(oldest);
      drop(block);
    }
  }

  void drop(void* block) {  // mutex held
    sizes_.erase(block);
    std::free(block);
  }

  c10::Allocator* fallback_;
  size_t limit_;
  std::mutex mutex_;
  std::multimap<size_t, Cached> free_;           // cached blocks by size
  std::unordered_map<void*, size_t> sizes_;       // every block of ours alive or cached, with its size
  size_t cached_ = 0;
  uint64_t releases_ = 0, hits_ = 0;
};

inline BlockCache* BlockCache::instance = nullptr;

}  // namespace block_cache

// Put the block cache under torch's CPU allocator (once per process; later calls change its limit). Tensors
// allocated before keep their own deleters.
inline void install_block_cache(int64_t limit_bytes) {
  using block_cache::BlockCache;
  static std::once_flag once;
  std::call_once(once, [] {
    BlockCache::instance = new BlockCache(c10::GetCPUAllocator(), 0);  // never destroyed: tensors may outlive us
    c10::SetCPUAllocator(BlockCache::instance, /*priority=*/1);
  });
  BlockCache::instance->set_limit(static_cast<size_t>(limit_bytes));
}

// (bytes cached, blocks cached, requests served from the cache); zeros before install_block_cache.
inline std::tuple<int64_t, int64_t, int64_t> block_cache_stats() {
  using block_cache::BlockCache;
  return BlockCache::instance == nullptr ? std::tuple<int64_t, int64_t, int64_t>{0, 0, 0}
                                         : BlockCache::instance->stats();
}

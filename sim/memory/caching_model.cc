#include "sim/memory/caching_model.h"

#include <algorithm>
#include <limits>

namespace sgpu::sim::memory {

struct CachingModel::Block {
  std::size_t size = 0;
  std::size_t requested = 0;
  std::uint64_t address = 0;
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours within the segment
  Block* next = nullptr;
  void* holder_data = nullptr;
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;

// The aggregate figure and the block's pool's.
template <class F>
void each_type(bool small, F&& f) {
  f(static_cast<std::size_t>(StatType::AGGREGATE));
  f(static_cast<std::size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL));
}

void increase(StatArray& stat, bool small, std::size_t amount) {
  each_type(small, [&](std::size_t type) { stat[type].increase(amount); });
}

void decrease(StatArray& stat, bool small, std::size_t amount) {
  each_type(small, [&](std::size_t type) { stat[type].decrease(amount); });
}

}  // namespace

std::size_t round_size(std::size_t requested) {
  if (requested < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((requested + kMinBlockSize - 1) / kMinBlockSize);
}

std::size_t segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

bool CachingModel::BySize::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

CachingModel::CachingModel(std::uint64_t capacity) : capacity_(capacity) {
  stats_.max_split_size = static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max());
}

CachingModel::~CachingModel() = default;

CachingModel::Block* CachingModel::new_block() {
  if (spare_.empty()) return &arena_.emplace_back();
  Block* block = spare_.back();
  spare_.pop_back();
  *block = Block{};
  return block;
}

void CachingModel::delete_block(Block* block) { spare_.push_back(block); }

void CachingModel::set_holder_data(Block* block, void* data) { block->holder_data = data; }

void* CachingModel::holder_data(const Block* block) { return block->holder_data; }

std::size_t CachingModel::size_of(const Block* block) { return block->size; }

std::uint64_t CachingModel::address_of(const Block* block) { return block->address; }

CachingModel::Block* CachingModel::find_free(Pool& pool, std::size_t size) {
  Block key;
  key.size = size;
  const auto it = pool.lower_bound(&key);
  if (it == pool.end()) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingModel::Block* CachingModel::new_segment(Pool& pool, std::size_t size) {
  if (reserved_ > capacity_ || size > capacity_ - reserved_) return nullptr;
  if (shared_ != nullptr && !shared_->take(size)) return nullptr;
  Block* block = new_block();
  block->size = size;
  block->address = next_address_;
  block->small = &pool == &small_;
  next_address_ += size;
  reserved_ += size;
  increase(stats_.segment, block->small, 1);
  increase(stats_.reserved_bytes, block->small, size);
  ++stats_.num_device_alloc;
  return block;
}

void CachingModel::release_free_segments(Pool& pool) {
  for (auto it = pool.begin(); it != pool.end();) {
    Block* block = *it;
    if (block->is_split()) {
      ++it;
      continue;
    }
    it = pool.erase(it);
    ++stats_.num_device_free;
    reserved_ -= block->size;
    if (shared_ != nullptr) shared_->give(block->size);
    decrease(stats_.segment, block->small, 1);
    decrease(stats_.reserved_bytes, block->small, block->size);
    delete_block(block);
  }
}

std::uint64_t CachingModel::free_bytes() const {
  const std::uint64_t own = capacity_ > reserved_ ? capacity_ - reserved_ : 0;
  return shared_ != nullptr ? std::min(own, shared_->free()) : own;
}

void CachingModel::empty_cache() {
  ++stats_.num_sync_all_streams;
  release_free_segments(large_);
  release_free_segments(small_);
}

void CachingModel::reset_peak_stats() {
  for (StatArray* stat :
       {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
        &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
        &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    for (Stat& s : *stat) s.reset_peak();
  }
  stats_.oversize_allocations.reset_peak();
  stats_.oversize_segments.reset_peak();
}

void CachingModel::reset_accumulated_stats() {
  for (StatArray* stat :
       {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
        &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
        &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    for (Stat& s : *stat) s.reset_accumulated();
  }
  stats_.oversize_allocations.reset_accumulated();
  stats_.oversize_segments.reset_accumulated();
  stats_.num_alloc_retries = 0;
  stats_.num_ooms = 0;
  stats_.num_sync_all_streams = 0;
  stats_.num_device_alloc = 0;
  stats_.num_device_free = 0;
}

CachingModel::Block* CachingModel::malloc(std::size_t requested, OutOfMemory* failure) {
  const std::size_t size = round_size(requested);
  Pool& pool = size <= kSmallSize ? small_ : large_;
  Block* block = find_free(pool, size);
  if (block == nullptr) {
    const std::size_t segment = segment_size(size);
    block = new_segment(pool, segment);
    if (block == nullptr) {
      empty_cache();
      ++stats_.num_alloc_retries;
      block = new_segment(pool, segment);
    }
    if (block == nullptr) {
      ++stats_.num_ooms;
      const auto all = static_cast<std::size_t>(StatType::AGGREGATE);
      failure->tried = segment;
      failure->capacity = capacity_;
      failure->free = free_bytes();
      if (shared_ != nullptr) failure->others = shared_->others();
      failure->allocated = stats_.allocated_bytes[all].current;
      failure->reserved = stats_.reserved_bytes[all].current;
      return nullptr;
    }
  }
  return take(block, size, requested);
}

CachingModel::Block* CachingModel::take(Block* block, std::size_t size, std::size_t requested) {
  const std::size_t remaining = block->size - size;
  const bool split = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  const bool already_split = block->is_split();
  if (split) {
    Block* rest = block;
    block = new_block();
    block->size = size;
    block->address = rest->address;
    block->small = rest->small;
    block->prev = rest->prev;
    if (block->prev != nullptr) block->prev->next = block;
    block->next = rest;
    rest->prev = block;
    rest->address += size;
    rest->size -= size;
    (rest->small ? small_ : large_).insert(rest);
    if (already_split) {
      decrease(stats_.inactive_split_bytes, block->small, block->size);
    } else {
      increase(stats_.inactive_split_bytes, block->small, rest->size);
      increase(stats_.inactive_split, block->small, 1);
    }
  } else if (already_split) {
    decrease(stats_.inactive_split_bytes, block->small, block->size);
    decrease(stats_.inactive_split, block->small, 1);
  }
  block->allocated = true;
  block->requested = requested;
  increase(stats_.allocation, block->small, 1);
  increase(stats_.allocated_bytes, block->small, block->size);
  increase(stats_.active, block->small, 1);
  increase(stats_.active_bytes, block->small, block->size);
  increase(stats_.requested_bytes, block->small, block->requested);
  return block;
}

void CachingModel::merge(Block* into, Block* other, Pool& pool, std::int64_t* subsumed) {
  if (other == nullptr || other->allocated) return;
  if (into->prev == other) {  // [other into]
    into->address = other->address;
    into->prev = other->prev;
    if (into->prev != nullptr) into->prev->next = into;
  } else {  // [into other]
    into->next = other->next;
    if (into->next != nullptr) into->next->prev = into;
  }
  into->size += other->size;
  *subsumed += static_cast<std::int64_t>(other->size);
  pool.erase(other);
  delete_block(other);
}

void CachingModel::free(Block* block) {
  block->allocated = false;
  decrease(stats_.allocation, block->small, 1);
  decrease(stats_.allocated_bytes, block->small, block->size);
  const std::size_t size = block->size;
  const std::size_t requested = block->requested;
  Pool& pool = block->small ? small_ : large_;
  std::int64_t split_blocks = 0;
  std::int64_t split_bytes = 0;
  for (Block* neighbour : {block->prev, block->next}) {
    std::int64_t subsumed = 0;
    merge(block, neighbour, pool, &subsumed);
    if (subsumed > 0) {
      split_blocks -= 1;
      split_bytes -= subsumed;
    }
  }
  pool.insert(block);
  if (block->is_split()) {
    split_blocks += 1;
    split_bytes += static_cast<std::int64_t>(block->size);
  }
  if (split_blocks > 0) increase(stats_.inactive_split, block->small, split_blocks);
  if (split_blocks < 0) decrease(stats_.inactive_split, block->small, -split_blocks);
  if (split_bytes > 0) increase(stats_.inactive_split_bytes, block->small, split_bytes);
  if (split_bytes < 0) decrease(stats_.inactive_split_bytes, block->small, -split_bytes);
  decrease(stats_.active, block->small, 1);
  decrease(stats_.active_bytes, block->small, size);
  decrease(stats_.requested_bytes, block->small, requested);
  block->requested = 0;
  block->holder_data = nullptr;
}

}  // namespace sgpu::sim::memory

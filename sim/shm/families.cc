// The families every collective of the shared-memory transport is made of (NOTE [The
// shared-memory transport] in shm_backend.cc): a fold of every rank's data (all-reduce,
// reduce), every rank's piece to one or all (all-gather, gather), the pieces of one or all
// to each (reduce-scatter, scatter), and each rank's pieces to each (all-to-all).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

#include "sim/shm/group.h"
#include "sim/shm/reduce.h"

namespace sgpu::sim::shm {

void ShmBackend::average(at::Tensor& t) const {
  if (c10::isIntegralType(t.scalar_type(), false)) {
    t.div_(size_, "trunc");
  } else {
    t.div_(size_);
  }
}

void ShmBackend::reduce_into(CollectiveOp kind, Dense& t, Op op, int root) {
  const std::size_t e = t.work.element_size();
  const std::size_t n = t.work.numel();
  const c10::ScalarType dtype = t.work.scalar_type();
  const std::size_t cap = std::max<std::size_t>(1, segment_->slot_bytes() / e);
  const Descriptor d = descriptor(kind, t.work, n, root, static_cast<int>(op));
  std::size_t off = 0;
  do {
    const std::size_t c = std::min(cap, n - off);
    const int b = begin_stage();
    copy_bytes(segment_->slot(b, rank_), t.data() + off * e, c * e);
    sync(d, b, off == 0);
    std::byte* out = t.data() + off * e;
    if (c * e * size_ <= kFoldWhole || size_ == 1) {
      if (root < 0 || rank_ == root) {
        copy_bytes(out, segment_->slot(b, 0), c * e);
        for (int r = 1; r < size_; ++r) combine(out, segment_->slot(b, r), c, dtype, op);
      }
    } else {
      const std::size_t lo = c * rank_ / size_;
      const std::size_t hi = c * (rank_ + 1) / size_;
      std::byte* acc = segment_->slot(b, 0) + lo * e;
      for (int r = 1; r < size_; ++r) {
        combine(acc, segment_->slot(b, r) + lo * e, hi - lo, dtype, op);
      }
      meet(d);
      if (root < 0 || rank_ == root) copy_bytes(out, segment_->slot(b, 0), c * e);
    }
    off += c;
  } while (off < n);
  if (op == Op::AVG && (root < 0 || rank_ == root)) average(t.work);
}

void ShmBackend::gather_into(CollectiveOp kind, const at::Tensor& input,
                             const std::vector<at::Tensor>& outputs, int root) {
  Dense in(input, op_name(kind));
  std::vector<Dense> outs;
  for (const at::Tensor& o : outputs) {
    outs.emplace_back(o, op_name(kind));
    TORCH_CHECK(o.numel() == input.numel() && o.scalar_type() == input.scalar_type(), op_name(kind),
                ": each output must be like the input (", input.numel(), ' ', input.scalar_type(),
                "), one is ", o.numel(), ' ', o.scalar_type());
  }
  const std::size_t e = input.element_size();
  const std::size_t n = input.numel();
  const std::size_t cap = std::max<std::size_t>(1, segment_->slot_bytes() / e);
  const Descriptor d = descriptor(kind, in.work, n, root, -1);
  std::size_t off = 0;
  do {
    const std::size_t c = std::min(cap, n - off);
    const int b = begin_stage();
    copy_bytes(segment_->slot(b, rank_), in.data() + off * e, c * e);
    sync(d, b, off == 0);
    for (std::size_t r = 0; r < outs.size(); ++r) {
      copy_bytes(outs[r].data() + off * e, segment_->slot(b, static_cast<int>(r)), c * e);
    }
    off += c;
  } while (off < n);
  for (Dense& o : outs) o.finish();
}

void ShmBackend::scatter_from(CollectiveOp kind, const std::vector<at::Tensor>& inputs,
                              const at::Tensor& output, int reduce, int root) {
  Dense out(output, op_name(kind));
  std::vector<Dense> ins;
  for (const at::Tensor& i : inputs) {
    ins.emplace_back(i, op_name(kind));
    TORCH_CHECK(i.numel() == output.numel() && i.scalar_type() == output.scalar_type(),
                op_name(kind), ": each input must be like the output (", output.numel(), ' ',
                output.scalar_type(), "), one is ", i.numel(), ' ', i.scalar_type());
  }
  const std::size_t e = output.element_size();
  const std::size_t n = output.numel();
  const c10::ScalarType dtype = output.scalar_type();
  const std::size_t cap =
      std::max<std::size_t>(1, segment_->slot_bytes() / (e * static_cast<std::size_t>(size_)));
  const Descriptor d = descriptor(kind, out.work, n, root, reduce);
  const int source = root >= 0 ? root : rank_;
  std::size_t off = 0;
  do {
    const std::size_t c = std::min(cap, n - off);
    const int b = begin_stage();
    if (rank_ == source) {
      for (std::size_t j = 0; j < ins.size(); ++j) {
        copy_bytes(segment_->slot(b, rank_) + j * c * e, ins[j].data() + off * e, c * e);
      }
    }
    sync(d, b, off == 0);
    std::byte* dst = out.data() + off * e;
    const std::size_t mine = static_cast<std::size_t>(rank_) * c * e;
    if (root >= 0) {
      copy_bytes(dst, segment_->slot(b, root) + mine, c * e);
    } else {
      copy_bytes(dst, segment_->slot(b, 0) + mine, c * e);
      for (int r = 1; r < size_; ++r) {
        combine(dst, segment_->slot(b, r) + mine, c, dtype, static_cast<Op>(reduce));
      }
    }
    off += c;
  } while (off < n);
  if (reduce == static_cast<int>(Op::AVG)) average(out.work);
  out.finish();
}

std::vector<ShmBackend::Piece> ShmBackend::split_rows(const Dense& t,
                                                      const std::vector<int64_t>& splits,
                                                      const char* which) const {
  const int64_t rows = t.work.dim() == 0 ? 1 : t.work.size(0);
  const std::size_t row_bytes = rows == 0 ? 0 : t.bytes() / static_cast<std::size_t>(rows);
  std::vector<int64_t> counts = splits;
  if (counts.empty()) {
    TORCH_CHECK(rows % size_ == 0, "all_to_all_single: the ", which, "'s first dimension (", rows,
                ") does not split evenly across ", size_, " ranks; pass splits");
    counts.assign(size_, rows / size_);
  }
  TORCH_CHECK(static_cast<int>(counts.size()) == size_, "all_to_all_single: ", counts.size(), " ",
              which, " splits for ", size_, " ranks");
  int64_t total = 0;
  for (int64_t c : counts) {
    TORCH_CHECK(c >= 0, "all_to_all_single: a negative ", which, " split");
    total += c;
  }
  TORCH_CHECK(total == rows, "all_to_all_single: the ", which, " splits add up to ", total,
              ", the tensor has ", rows, " rows");
  std::vector<Piece> pieces;
  std::size_t at = 0;
  for (int64_t c : counts) {
    const std::size_t bytes = static_cast<std::size_t>(c) * row_bytes;
    pieces.push_back({t.data() + at, bytes});
    at += bytes;
  }
  return pieces;
}

void ShmBackend::exchange(const std::vector<Piece>& sends, const std::vector<Piece>& receives,
                          c10::ScalarType dtype) {
  const std::size_t q = std::max<std::size_t>(1, segment_->slot_bytes() / size_);
  Descriptor d{};
  d.seq = seq_;
  d.op = static_cast<std::uint32_t>(CollectiveOp::kAllToAll);
  d.dtype = static_cast<std::int32_t>(dtype);
  for (const Piece& p : sends) d.extra = std::max<std::uint64_t>(d.extra, p.bytes);
  std::size_t stages = 1;
  for (std::size_t k = 0; k < stages; ++k) {
    const int b = begin_stage();
    std::byte* mine = segment_->slot(b, rank_);
    for (int dst = 0; dst < size_; ++dst) {
      const Piece& p = sends[dst];
      const std::size_t from = std::min(p.bytes, k * q);
      copy_bytes(mine + dst * q, p.data + from, std::min(q, p.bytes - from));
    }
    if (k == 0) {
      std::uint64_t* lengths = segment_->lengths(b, rank_);
      for (int r = 0; r < size_; ++r) {
        lengths[r] = sends[r].bytes;
        lengths[size_ + r] = receives[r].bytes;
      }
    }
    sync(d, b, k == 0);
    if (k == 0) {
      std::uint64_t longest = 0;
      for (int r = 0; r < size_; ++r) {
        longest = std::max(longest, segment_->state(r).descriptor[b].extra);
      }
      stages = std::max<std::size_t>(1, (longest + q - 1) / q);
      check_lengths(b, d);
    }
    for (int src = 0; src < size_; ++src) {
      const Piece& p = receives[src];
      const std::size_t from = std::min(p.bytes, k * q);
      copy_bytes(p.data + from, segment_->slot(b, src) + rank_ * q, std::min(q, p.bytes - from));
    }
  }
}

void ShmBackend::check_lengths(int buffer, const Descriptor& d) const {
  for (int s = 0; s < size_; ++s) {
    for (int r = 0; r < size_; ++r) {
      const std::uint64_t sent = segment_->lengths(buffer, s)[r];
      const std::uint64_t expected = segment_->lengths(buffer, r)[size_ + s];
      if (sent != expected) {
        std::ostringstream out;
        out << describe(d) << ": rank " << s << " sends " << sent << " bytes to rank " << r
            << ", which expects " << expected << " from it (the splits disagree)";
        C10_THROW_ERROR(DistBackendError, out.str());
      }
    }
  }
}

}  // namespace sgpu::sim::shm

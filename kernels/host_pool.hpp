// HostPool: the host backend's own team of threads for work that splits into
// independent items (the groups of a grouped GEMM, the (batch, head) pairs of
// attention, the row blocks of one large GEMM). OpenBLAS runs single-threaded
// in troupe (HostBackend), so an item's GEMMs give the bits of a 1-thread run,
// at any pool size.
//
// Determinism: an item is computed wholly by one thread and its result does
// not depend on which one (per-thread scratch is indexed by `worker` and fully
// written before it is read), so the output is the same bits whatever the
// schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace troupe::kernels::host {

class HostPool {
 public:
  // threads >= 1: the caller plus threads - 1 workers, started now.
  explicit HostPool(int threads);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  int size() const { return size_; }

  // Runs body(i, worker) once for every i in [0, n) and returns when all are
  // done; worker in [0, size()) names the thread (the caller is 0). Items are
  // handed out in index order to whichever thread is free, so list the
  // costliest first. With one thread, or n < 2, it is a plain loop on the
  // caller. It never touches OpenBLAS's thread count: that count is
  // process-wide, and changing it here changed the bits of another device's
  // GEMM in flight (bench/results/same_bits.md). The first
  // exception thrown by a body is rethrown here after every item has run.
  // A call made while another runs on the same pool (from another thread, or
  // from a body) is a plain loop on its own caller.
  void run(int64_t n, const std::function<void(int64_t item, int worker)>& body);

 private:
  struct Shared;
  int size_;
  std::unique_ptr<Shared> shared_;
};

}  // namespace troupe::kernels::host

// Threading goes through ParallelFor only, so kernels stay free of threading detail.
// Backed by OpenMP; SetThreadCount applies process-wide (the CLI's -t).
#pragma once

#include <cstdint>
#include <functional>

namespace polestar {

void SetThreadCount(int threads);  // <= 0: all hardware threads
int ThreadCount();

// Splits [0, n) into chunks of at least `grain` items and calls fn(begin, end) for each,
// in parallel. Runs inline when there is a single chunk or when already inside a
// parallel region. An exception from fn is rethrown once every chunk has ended (the first,
// when several throw).
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace polestar

#include "base/parallel.h"

#include <omp.h>

#include <algorithm>
#include <exception>

namespace polestar {

void SetThreadCount(int threads) {
  omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
}

int ThreadCount() { return omp_get_max_threads(); }

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t threads = omp_in_parallel() ? 1 : ThreadCount();
  const int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  // An exception must not leave an OpenMP region (the process would terminate): the first
  // one thrown is kept and rethrown here, after every chunk has ended.
  std::exception_ptr error;
#pragma omp parallel for num_threads(int(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = n * c / chunks;
    const int64_t end = n * (c + 1) / chunks;
    try {
      fn(begin, end);
    } catch (...) {
#pragma omp critical(polestar_parallel_for_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace polestar

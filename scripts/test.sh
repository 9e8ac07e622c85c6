#!/usr/bin/env bash
# Checks the formatting, builds everything and runs every test, then runs them again under
# sanitizers:
#   1. build/       Release, warnings are errors: every test; then the forward's suites again
#                   on the checking backend (POLESTAR_BACKEND=checked);
#   2. build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer (gcc): every test, with the
#                   CUDA backend built over the host emulation (tests/cuda_emulation/), so its
#                   conformance and agreement cases run its host code and kernels here;
#   3. build-tsan/  ThreadSanitizer (clang with LLVM's OpenMP, which loads its Archer tool
#                   into a TSan program to tell TSan about OpenMP's synchronisation): the
#                   threaded tests, server_test and polestar_test.
# Any sanitizer report stops the program, which fails its test. Installs missing Debian
# packages first. Prints each stage's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
started=$SECONDS
stage_done() { echo "=== $1 done: $((SECONDS - started)) s"; started=$SECONDS; }

# The tree matches .clang-format (fuzz corpora are data, not source).
git ls-files '*.cpp' '*.h' '*.cpp.in' '*.cu' '*.cuh' | grep -v '^tests/fuzz/corpus/' |
  xargs clang-format --dry-run --Werror
stage_done "clang-format"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPOLESTAR_WERROR=ON
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 1500
stage_done "Release"

# The suites that run the forward (decode traces, the standing test, batch invariance,
# Polestar, Elastic-Cache, MoE and block diffusion, the models, the server) again on the
# checking backend (backend/checked/), which every model's default backend becomes: host
# code that reads backend memory crashes there, and an op handed memory from the wrong side
# of the seam aborts.
# Left out there: the 54 reference decodes through the CLI (DeviceAgreement decodes them on the
# checking backend above), the probe's accuracy in aggregate (DeviceAgreement's probe case runs
# its policies there), the start-stop race (no model) and the resident-memory loop (the
# server's memory, which the Release run measures).
checked_exclusions='^(FixtureDecode\.EveryReferenceRunIsReproducedThroughTheCli|ProbeCheckpoint\.PolestarAgreesWithTheAuthorsCodeInAggregate|HttpServer\.StopRightAfterStartEndsEveryHandler|Server\.NoMemoryGrowthAcrossManyRequests)$'
POLESTAR_BACKEND=checked ctest --test-dir build --output-on-failure -j"$jobs" --timeout 1500 \
  -L '^(decode_test|batch_test|polestar_test|elastic_test|model_test|server_test)$' \
  -E "$checked_exclusions"
stage_done "checking backend"

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPOLESTAR_WERROR=ON \
  -DPOLESTAR_SANITIZE=address,undefined -DPOLESTAR_BUILD_BENCH=OFF -DPOLESTAR_CUDA_EMULATION=ON
cmake --build build-asan -j"$jobs"
# Excluded under ASan: Server.NoMemoryGrowthAcrossManyRequests and
# Jinja.TheBytesHeldAtOnceAreBounded measure resident memory, which ASan's quarantine and
# allocator grow by design (by 200 MB; 23 MB without the quarantine); LeakSanitizer checks
# every test here for leaks, and the Release run covers those tests.
# HttpServer.OutOfFileDescriptorsNeitherSpinsNorStopsAnswering runs the process out of file
# descriptors, and the sanitizers need descriptors themselves (UBSan's vptr check probes memory
# through a pipe and reports a false error when it cannot open one); the Release run covers it.
sanitizer_exclusions='^(Server\.NoMemoryGrowthAcrossManyRequests|Jinja\.TheBytesHeldAtOnceAreBounded|HttpServer\.OutOfFileDescriptorsNeitherSpinsNorStopsAnswering)$'
# Loops of whole generations, excluded here because each takes minutes under ASan and smaller
# tests run the same code: the 54 reference decodes and the probe's policies on every device
# backend (on the emulated CUDA backend they are left to a GPU, scripts/gpu-check.sh; the
# checking backend runs them in the Release stage; decode_test's and polestar_test's cases run
# those decodes here), the probe's and the bundled model's accuracy in aggregate (hundreds of
# generations each; their numbers are the Release stage's), and the start-stop race's 4000
# rounds (a thread race, which the Release and ThreadSanitizer runs look for).
# The conformance suite, the emulation's own test and the full-pass agreement run here.
long_exclusions='^(Registered/DeviceAgreement\.(ReferenceRunsDecodeTheCpuTokens|DriftAwarePoliciesOnTheProbeWithinTheCpuMargins)/.*|ProbeCheckpoint\.PolestarAgreesWithTheAuthorsCodeInAggregate|CliBundledModel\.IsTheDefaultAndSolvesItsHeldOutTasks|HttpServer\.StopRightAfterStartEndsEveryHandler)$'

ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 3000 \
  -E "$sanitizer_exclusions|$long_exclusions"
stage_done "AddressSanitizer + UndefinedBehaviorSanitizer"

cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
  -DPOLESTAR_SANITIZE=thread -DPOLESTAR_BUILD_BENCH=OFF
cmake --build build-tsan -j"$jobs" --target server_test polestar_test
# Excluded under TSan, as under ASan: the resident-memory test (TSan's allocator and shadow
# memory grow RSS by design; it grew 4.3 MB over 1200 requests against a 4 MB bar) and the
# out-of-descriptors test.
TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 second_deadlock_stack=1" \
  ctest --test-dir build-tsan --output-on-failure -j"$jobs" --timeout 3000 \
  -L '^(server_test|polestar_test)$' -E "$sanitizer_exclusions"
stage_done "ThreadSanitizer"

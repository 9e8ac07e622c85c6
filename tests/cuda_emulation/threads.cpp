// The emulation's blocks: one at a time, each thread a fiber on the host thread that runs
// the launch. A thread runs until it waits at a barrier or finishes; once every
// thread has stopped, the barriers every participant has reached are released and the threads
// run again, in alternating order (so a read of another thread's write without a barrier
// between them goes wrong in one direction or the other). A barrier that can never be released
// ends the program with the kernel's name.
#include <sanitizer/common_interface_defs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emulation/device.h"
#include "cuda_emulation/emulation.h"

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

#if !defined(__x86_64__)
#error "the CUDA emulation switches fibers with x86-64 code"
#endif

// Saves the callee-saved registers, the SSE and x87 control words and the stack pointer (at
// *save), then loads those of the stack at `load` and returns there. A few instructions, where
// swapcontext makes two system calls (the signal mask) per switch.
extern "C" void PolestarSwitchStacks(void** save, void* load);
asm(R"(
  .text
  .globl PolestarSwitchStacks
  .type PolestarSwitchStacks, @function
PolestarSwitchStacks:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size PolestarSwitchStacks, .-PolestarSwitchStacks
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace cuda_emulation {
namespace {

// Stacks of 256 KiB with a guard page below: kernels keep little on the stack, the sanitizers
// more.
constexpr size_t kStackBytes = size_t(256) << 10;
constexpr int kMaxThreads = 1024;
constexpr size_t kExchangeBytes = 16;  // the largest value a shuffle carries

enum class State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  void* stack_pointer = nullptr;  // where PolestarSwitchStacks left it
  uint8_t* stack = nullptr;       // [kStackBytes] above a guard page, kept for later launches
  State state = State::kDone;
  unsigned warp_mask = 0;      // at a warp barrier: the lanes it waits with
  void* fake_stack = nullptr;  // AddressSanitizer's, while the fiber is switched out
};

// The block running now (blocks run one at a time, under Lock()).
struct Block {
  const void* kernel = nullptr;
  const std::function<void()>* body = nullptr;
  int threads = 0;
  std::vector<Fiber> fibers{size_t(kMaxThreads)};
  int current = -1;
  void* scheduler_stack_pointer = nullptr;
  // The scheduler's stack, for AddressSanitizer's fiber switches.
  const void* scheduler_bottom = nullptr;
  size_t scheduler_size = 0;
  void* scheduler_fake_stack = nullptr;
  std::vector<uint8_t> dynamic_shared;  // [launch's dynamic bytes]
  std::array<std::array<uint8_t, kExchangeBytes>, kMaxThreads> exchange;  // a slot per thread
};

// Never destroyed: launches may come during exit. Made before main, so reading it costs no
// guard (the scheduler reads it at every switch).
Block* const running_block = new Block;
Block& Running() { return *running_block; }

// AddressSanitizer is told of every switch, so it knows which stack is live.
void StartSwitch(void** fake_stack_save, const void* bottom, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#endif
}
void FinishSwitch(void* fake_stack, const void** bottom_old, size_t* size_old) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#endif
}

// From a fiber back to the scheduler; returns when the scheduler resumes it (never for a
// finished one).
void ToScheduler(State state) {
  Block& block = Running();
  Fiber& fiber = block.fibers[size_t(block.current)];
  fiber.state = state;
  StartSwitch(&fiber.fake_stack, block.scheduler_bottom, block.scheduler_size);
  PolestarSwitchStacks(&fiber.stack_pointer, block.scheduler_stack_pointer);
  FinishSwitch(fiber.fake_stack, &block.scheduler_bottom, &block.scheduler_size);
}

// A fiber never ends: once its thread of a block is done it waits to be the same thread of
// a later block (so AddressSanitizer keeps one fake stack per fiber, not one per thread run).
void FiberMain() {
  Block& block = Running();
  FinishSwitch(nullptr, &block.scheduler_bottom, &block.scheduler_size);
  for (;;) {
    (*block.body)();
    ToScheduler(State::kDone);
  }
}

void Resume(int thread) {
  Block& block = Running();
  Fiber& fiber = block.fibers[size_t(thread)];
  const unsigned x = blockDim.x, y = blockDim.y;
  threadIdx = {unsigned(thread) % x, unsigned(thread) / x % y, unsigned(thread) / (x * y)};
  block.current = thread;
  StartSwitch(&block.scheduler_fake_stack, fiber.stack, kStackBytes);
  PolestarSwitchStacks(&block.scheduler_stack_pointer, fiber.stack_pointer);
  FinishSwitch(block.scheduler_fake_stack, nullptr, nullptr);
  block.current = -1;
}

[[noreturn]] void Stuck(const char* why) {
  const Block& block = Running();
  int at_block = 0, at_warp = 0, done = 0;
  for (int t = 0; t < block.threads; ++t) {
    const State s = block.fibers[size_t(t)].state;
    at_block += s == State::kAtBlockBarrier;
    at_warp += s == State::kAtWarpBarrier;
    done += s == State::kDone;
  }
  Die("%s, block (%u,%u,%u) of %d threads: %s (%d at __syncthreads, %d at a warp barrier, %d "
      "finished); a GPU would hang or go wrong here",
      KernelName(block.kernel).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, block.threads, why,
      at_block, at_warp, done);
}

// Releases what can be released once every thread has stopped; false if nothing could be.
bool Release() {
  Block& block = Running();
  bool released = false;
  int at_block = 0;
  for (int t = 0; t < block.threads; ++t)
    at_block += block.fibers[size_t(t)].state == State::kAtBlockBarrier;
  if (at_block == block.threads) {
    for (int t = 0; t < block.threads; ++t) block.fibers[size_t(t)].state = State::kReady;
    return true;
  }
  for (int warp = 0; warp * warpSize < block.threads; ++warp) {
    unsigned waiting = 0, mask = 0;
    bool same_mask = true;
    for (int lane = 0; lane < warpSize && warp * warpSize + lane < block.threads; ++lane) {
      const Fiber& fiber = block.fibers[size_t(warp * warpSize + lane)];
      if (fiber.state != State::kAtWarpBarrier) continue;
      if (waiting != 0 && fiber.warp_mask != mask) same_mask = false;
      waiting |= 1u << lane;
      mask = fiber.warp_mask;
    }
    if (waiting == 0) continue;
    if (!same_mask) Stuck("lanes of one warp wait at warp barriers with different masks");
    if (waiting != mask) continue;  // lanes of the mask still to come
    for (int lane = 0; lane < warpSize; ++lane) {
      if ((mask >> lane) & 1u) block.fibers[size_t(warp * warpSize + lane)].state = State::kReady;
    }
    released = true;
  }
  return released;
}

void RunBlock() {
  Block& block = Running();
  for (int t = 0; t < block.threads; ++t) {
    Fiber& fiber = block.fibers[size_t(t)];
    if (fiber.stack == nullptr) {
      const long page = sysconf(_SC_PAGESIZE);
      void* mapping = mmap(nullptr, kStackBytes + size_t(page), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (mapping == MAP_FAILED) Die("no memory for a thread's stack");
      mprotect(mapping, size_t(page), PROT_NONE);  // an overflow faults
      fiber.stack = static_cast<uint8_t*>(mapping) + page;
      // The frame PolestarSwitchStacks returns through: control words, six registers, then
      // FiberMain as the return address, entered with the stack aligned as after a call.
      auto* top = reinterpret_cast<uint64_t*>(fiber.stack + kStackBytes);
      uint64_t* frame = top - 1 - 1 - 6 - 1;  // a null return address for FiberMain itself
      uint32_t control[2] = {0, 0};
      asm volatile("stmxcsr %0\n\tfnstcw %1" : "+m"(control[0]), "+m"(control[1]));
      std::memcpy(&frame[0], control, sizeof control);
      for (int r = 1; r <= 6; ++r) frame[r] = 0;
      frame[7] = reinterpret_cast<uint64_t>(&FiberMain);
      frame[8] = 0;
      fiber.stack_pointer = frame;
    }
    fiber.state = State::kReady;
  }
  bool forward = true;
  for (;;) {
    for (int i = 0; i < block.threads; ++i) {
      const int t = forward ? i : block.threads - 1 - i;
      if (block.fibers[size_t(t)].state == State::kReady) Resume(t);
    }
    forward = !forward;
    int done = 0;
    for (int t = 0; t < block.threads; ++t) done += block.fibers[size_t(t)].state == State::kDone;
    if (done == block.threads) return;
    if (!Release()) Stuck("a barrier not every thread it waits for can reach");
  }
}

}  // namespace

std::string KernelName(const void* kernel) {
  char name[512] = "";
#if defined(__SANITIZE_ADDRESS__)
  // The symbolizer takes a return address and looks up the instruction before it: one byte
  // into the kernel names the kernel, its entry the function before it.
  __sanitizer_symbolize_pc(static_cast<char*>(const_cast<void*>(kernel)) + 1, "%f", name,
                           sizeof name);
#endif
  char text[600];
  std::snprintf(text, sizeof text, "kernel %p %s", kernel, name);
  return text;
}

void RunGrid(const void* kernel, dim3 grid, dim3 block_size, size_t dynamic_shared_bytes,
             const std::function<void()>& thread_body) {
  Block& block = Running();
  block.kernel = kernel;
  block.body = &thread_body;
  block.threads = int(block_size.x * block_size.y * block_size.z);
  // Poisoned, as a GPU's shared memory holds whatever was there.
  block.dynamic_shared.assign(dynamic_shared_bytes, 0xa5);
  gridDim = grid;
  blockDim = block_size;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        RunBlock();
      }
    }
  }
  block.body = nullptr;
}

void SyncThreads() {
  if (Running().current < 0) Die("__syncthreads outside a kernel");
  ToScheduler(State::kAtBlockBarrier);
}

void SyncWarp(unsigned mask) {
  Block& block = Running();
  if (block.current < 0) Die("__syncwarp outside a kernel");
  const int lane = block.current % warpSize;
  if (((mask >> lane) & 1u) == 0) Stuck("a lane waits at a warp barrier whose mask leaves it out");
  block.fibers[size_t(block.current)].warp_mask = mask;
  ToScheduler(State::kAtWarpBarrier);
}

void WarpExchange(unsigned mask, const void* value, size_t bytes, int source, void* result) {
  Block& block = Running();
  if (bytes > kExchangeBytes) Die("a shuffle of %zu bytes", bytes);
  const int me = block.current;
  const int warp_base = me / warpSize * warpSize;
  if (((mask >> source) & 1u) == 0 || warp_base + source >= block.threads) {
    Stuck("a shuffle reads a lane outside its mask");
  }
  std::memcpy(block.exchange[size_t(me)].data(), value, bytes);
  SyncWarp(mask);  // every lane has written
  std::memcpy(result, block.exchange[size_t(warp_base + source)].data(), bytes);
  SyncWarp(mask);  // every lane has read: the slots may be written again
}

void* DynamicShared() {
  Block& block = Running();
  return block.dynamic_shared.empty() ? nullptr : block.dynamic_shared.data();
}

void CheckMatrixPointer(const void* pointer, unsigned ldm, size_t element_bytes, const char* what) {
  if (Running().current < 0) Die("%s outside a kernel", what);
  if (reinterpret_cast<uintptr_t>(pointer) % 32 != 0) {
    Die("%s at %p: a warp matrix pointer must be 32-byte aligned", what, pointer);
  }
  if (ldm * element_bytes % 16 != 0) {
    Die("%s with ldm %u: a warp matrix's rows must be a multiple of 16 bytes apart", what, ldm);
  }
}

}  // namespace cuda_emulation

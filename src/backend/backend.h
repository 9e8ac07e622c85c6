// The seam between the model and the hardware it runs on: the op set one decoding step
// uses, the memory those ops read and write, and the transfers between that memory and the
// host. Forward (model/forward.h) and the model's drift ops run against a Backend; kernels
// behind it know nothing of models, caches or policies. Backends live one per folder
// (backend/cpu/, ...) and register themselves in one place (backend/registry.h).
//
// Memory. Pointers handed to the ops point into Buffers allocated by the same backend
// ("backend memory"), or into weights bound to it (ResidentWeights, model/model.h), except
// where an op says "host". Host code never reads or writes backend memory directly: it moves
// bytes with Upload and Download, which are the only crossings and are counted by whoever
// issues them (Forward's TransferCounts). Index lists (rows, positions, tokens) are host
// arguments: they are the step's plan, which a device backend stages itself; lists the ops
// compute (a mixture's routing) stay in backend memory. Legend as
// in ops/ops.h: M rows computed, K input width, N output width, L canvas length, H query
// heads, Hkv key/value heads, D head dim, C model width.
//
// Order. Ops run in the order they are issued on the calling thread's queue; Download returns
// when its bytes are on the host. Work issued inside a SideQueue job runs on the backend's
// second queue, concurrently with the main one (see SideQueue).
//
// Batches: a batch of sequences runs as one step whose rows are the concatenation of every
// sequence's rows, so the row-wise ops (RMSNorm, SwiGLU, add, row copies, embedding) take the
// batch's rows as they take one sequence's; RoPE takes each row's position. The matrix
// products also take the rows' split into sequences (RowSegments), because a kernel may
// choose its method by row count and every sequence must get the bits it gets alone (on a
// backend whose contract says it is batch invariant). Attention runs per sequence, over that
// sequence's own cache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "backend/types.h"

namespace polestar {

class Backend;

// What a Buffer holds. BF16 and F16 elements are stored as uint16_t.
enum class ElementType { kF32, kBf16, kF16, kF64, kI32, kU8 };
int64_t ElementBytes(ElementType type);

// Where backend memory lies. kOffloaded: off the accelerator, where the backend's ops still
// read and write it in place (pinned host memory a GPU reaches over the bus): for a store
// that ops read a few rows at a time (Polestar's NVFP4 residuals), which then takes no
// accelerator memory, and of which an op moves only the rows it reads. To host code both are
// backend memory alike; a backend that computes in host memory places both there.
enum class Placement { kBackend, kOffloaded };

// An owning array of `size` elements of one type in a backend's memory. Copies allocate on
// the same backend, with the same placement.
class Buffer {
 public:
  enum class Init { kZero, kNone };
  Buffer() = default;
  Buffer(const Backend& backend, int64_t size, Init init = Init::kZero)
      : Buffer(backend, size, ElementType::kF32, init) {}
  Buffer(const Backend& backend, int64_t size, ElementType type, Init init = Init::kZero,
         Placement placement = Placement::kBackend);
  Buffer(const Buffer& other);
  Buffer& operator=(const Buffer& other);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();

  // The elements as floats (an F32 buffer).
  float* data() { return As<float>(); }
  const float* data() const { return As<float>(); }
  // The elements as T, which must have the buffer's element size (uint16_t for BF16/F16).
  template <class T>
  T* As() {
    CheckElement(sizeof(T));
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* As() const {
    CheckElement(sizeof(T));
    return static_cast<const T*>(data_);
  }
  ElementType type() const { return type_; }
  int64_t size() const { return size_; }
  int64_t bytes() const { return size_ * ElementBytes(type_); }
  bool empty() const { return size_ == 0; }
  const Backend* backend() const { return backend_; }
  Placement placement() const { return placement_; }
  // Grows to at least `size` elements (scratch reuse across steps: no allocation once warm).
  // Growing does not keep the contents; a size within the current one keeps everything.
  void Reserve(int64_t size);

 private:
  void Release();
  void CheckElement(size_t bytes) const;

  const Backend* backend_ = nullptr;
  ElementType type_ = ElementType::kF32;
  Placement placement_ = Placement::kBackend;
  void* data_ = nullptr;
  int64_t size_ = 0;
};

// What a backend guarantees, so tests and users know what to hold it to (docs/architecture.md,
// "Backend contracts").
struct BackendContract {
  // Every op gives, bit for bit, what its scalar twin (ops/reference.h) gives with the same
  // activation precision: decode traces reproduce the reference fixtures exactly.
  bool exact_to_scalar_twins = false;
  // A sequence's rows get the same bits in any batch (MatMulBatch's segments).
  bool batch_invariant = false;
  // Backend memory is host memory (host code could read it; it still must not).
  bool host_memory = false;
};

// A backend's memory as it counts it, in bytes; -1 where it does not count (the CPU's is the
// process's, which the resident set shows).
struct MemoryUse {
  int64_t held = -1;            // Placement::kBackend memory allocated now
  int64_t peak = -1;            // the most of it held at once since ResetMemoryPeak
  int64_t offloaded = -1;       // Placement::kOffloaded memory allocated now
  int64_t offloaded_peak = -1;  // the most of that since ResetMemoryPeak
};

// A second queue for work that may overlap the main one (Polestar's clustering, proxy
// attention and NVFP4 store at block start). A job's ops are issued on this queue; the CPU
// backend runs jobs on a worker thread, a device backend on a second stream. One job is in
// flight at a time. Which ops a job may issue: the drift ops of model/forward.h that only
// read the cache (ReadHidden, ProjectQueries, UnrotatedKeys, ProxyAttention,
// CachedRowsAttention, HeadMeanDrift), with a DriftScratch of the job's own; the clustering
// and NVFP4 ops (SphericalKMeans, ResidualAbsMax, QuantizeResiduals) and Copy into memory the
// main queue does not touch meanwhile; their downloads, and host work on their results; never
// an op that writes the cache or the main queue's scratch.
class SideQueue {
 public:
  virtual ~SideQueue() = default;
  // Waits for the job before, then starts `job`.
  virtual void Run(std::function<void()> job) = 0;
  // Returns when the last job has finished; rethrows what it threw.
  virtual void Wait() = 0;
};

// Ops recorded once to be issued again as a whole (Backend::Record): on a GPU a CUDA graph,
// whose replay costs one launch where the ops cost one each.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
};

enum class DriftMetric { kKl, kCosine };
// The KL's logs of HeadMeanDrift's two distributions, each [rows, H, L] (backend memory,
// F64 Buffers), for a caller
// that compares every distribution twice: as `now`, then as the next call's `before`. `now`
// (if set) receives now's logs; `before` (if set) supplies before's, the `now` of the call
// before. Each log is then taken once; the drift keeps its bits.
struct DriftLogs {
  double* now = nullptr;
  const double* before = nullptr;
};

// The rows of a batched op, one count per sequence in order; they sum to the op's M.
using RowSegments = std::span<const int64_t>;

// One attention of a batched step (Backend::AttentionBatch): q and out [rows, H*D] over the
// keys k, v [keys, Hkv*D] (a sequence's cache, or the first keys of it a block-causal run sees).
struct AttentionCall {
  const float* q = nullptr;
  int64_t rows = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t keys = 0;
  float* out = nullptr;
};

// One of RmsNormProducts' products of the normed rows: y[M, N] = normed · w[N, K]^T
// (+ bias[N] when given).
struct NormedProduct {
  WeightView w;
  float* y = nullptr;
  const float* bias = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  virtual BackendContract contract() const = 0;
  // Whether weights bound to this backend stay where the host loaded them (zero copy): a
  // backend that computes in host memory. Otherwise Model::On copies them in once.
  virtual bool ViewsHostWeights() const = 0;

  // Memory: `bytes` bytes of backend memory, zeroed when `zero`.
  virtual void* Allocate(int64_t bytes, bool zero) const = 0;
  virtual void Free(void* data) const = 0;
  // The same, placed off the accelerator (Placement::kOffloaded); a backend without one
  // places it as the rest.
  virtual void* AllocateOffloaded(int64_t bytes, bool zero) const { return Allocate(bytes, zero); }
  virtual void FreeOffloaded(void* data) const { Free(data); }
  // What this backend's memory holds (a device backend's: the accelerator's, the scarce kind,
  // and what it offloads).
  virtual MemoryUse Memory() const { return {}; }
  virtual void ResetMemoryPeak() const {}
  // Within backend memory.
  virtual void CopyBytes(const void* src, int64_t bytes, void* dst) const = 0;
  void Copy(const float* src, int64_t size, float* dst) const { CopyBytes(src, size * 4, dst); }
  // x[n] = 0.
  virtual void Zero(float* x, int64_t n) const = 0;
  // Host -> backend memory, and back. Download returns when the bytes are on the host.
  virtual void Upload(const void* host, int64_t bytes, void* dst) const = 0;
  virtual void Download(const void* src, int64_t bytes, void* host) const = 0;
  // Returns when every op issued so far on this thread's queue has finished.
  virtual void Synchronize() const = 0;
  // A second queue (see SideQueue).
  virtual std::unique_ptr<SideQueue> MakeSideQueue() const = 0;
  // Runs `issue`, which issues ops on this thread's main queue, and returns those ops
  // recorded for Replay; null where the backend does not record (the ops ran as issued, as
  // they also do when a recording fails). A recording names the memory the ops name and keeps
  // the host lists they took as they were then, so `issue` must issue the same ops whenever it
  // runs, whatever earlier ops computed; it may not wait for the queue (Download, Synchronize),
  // allocate, or free. The caller keeps that memory where it is while it replays.
  virtual std::unique_ptr<OpGraph> Record(const std::function<void()>& issue) const {
    issue();
    return nullptr;
  }
  // Issues a recording of this backend's again on the main queue; false (nothing issued) once
  // scratch of the backend's own that its ops used has been replaced: it never replays then.
  virtual bool Replay(const OpGraph& graph) const { return false; }

  // y[M, N] = x[M, K] · w[N, K]^T (+ bias[N] when given), for every weight type, with the M
  // rows of x split into `segments` (one per sequence of a batch, in order): each segment's
  // rows of y are, bit for bit, what the product of that segment alone gives, whatever the
  // other segments hold (batch invariance: a sequence decodes the same tokens in any batch).
  virtual void MatMulBatch(const float* x, RowSegments segments, const WeightView& w, float* y,
                           const float* bias = nullptr) const = 0;
  // One sequence's M rows.
  void MatMul(const float* x, int64_t m, const WeightView& w, float* y,
              const float* bias = nullptr) const {
    const int64_t rows[] = {m};
    MatMulBatch(x, rows, w, y, bias);
  }
  // The products of a routed batch's row groups, whose sizes only backend memory holds:
  // y[n, N] rows of group g = x[n, K] rows of group g · weights[g]^T, the groups' rows in
  // order (group 0's first). counts[S, G] (backend memory, GroupByExpert's; G =
  // |weights|, every view of one type and shape [N, K]) holds how many rows of each of S
  // sequences group g has; they sum to n. Group g's rows are split by sequence into segments
  // of counts[s, g] rows, as MatMulBatch's segments.
  virtual void MatMulGroups(const float* x, int64_t n, std::span<const WeightView> weights,
                            const int* counts, int64_t sequences, float* y) const = 0;
  // y[M, N] += x[M, K] · w[N, K]^T: each element of y plus MatMulBatch's product of it, in
  // one addition (the bits of MatMulBatch and then AddInPlace, where the backend's product is
  // the same either way), so a layer's output joins the residual stream without a pass of
  // its own on a device that adds in the product. Segments as MatMulBatch's. The default
  // multiplies into a buffer of its own and adds that.
  virtual void MatMulAddBatch(const float* x, RowSegments segments, const WeightView& w,
                              float* y) const;
  // normed[M, C] = RmsNorm(x[M, C]), then each product's y = normed · w^T (+ bias), the rows
  // split into segments as MatMulBatch's: bit for bit RmsNorm and one MatMulBatch a product
  // (normed may alias x). A device that multiplies the normed rows in a reduced precision
  // rounds them once, in the norm's own pass, for every product. The default issues those
  // ops.
  virtual void RmsNormProducts(const float* x, RowSegments segments, int64_t c, const float* weight,
                               float eps, float* normed,
                               std::span<const NormedProduct> products) const;
  // out[M, C] = x[M, C] / rms(x) * weight[C]. out may alias x.
  virtual void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
                       float* out) const = 0;
  // x[M, heads * D] rotated in place (inverse: un-rotated), row i at position positions[i]
  // (host), with a table bound to this backend (ResidentWeights::rope). See ops.h ApplyRope.
  virtual void ApplyRope(float* x, std::span<const int> positions, int heads,
                         const RopeTable& table, bool interleaved) const = 0;
  virtual void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
                        bool interleaved) const = 0;
  // Bidirectional attention of q[M, H*D] over k, v[L, Hkv*D] -> out[M, H*D]; query head h
  // reads key/value head h / (H / Hkv). probs, when non-null, receives [M, H, L].
  virtual void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l,
                         int heads, int kv_heads, int head_dim, float* out,
                         float* probs = nullptr) const = 0;
  // Every call's Attention (without probabilities), in any order, each call's out the bits
  // Attention gives it alone: a step's sequences at once, in one launch where the device
  // can. The default issues them one by one.
  virtual void AttentionBatch(std::span<const AttentionCall> calls, int heads, int kv_heads,
                              int head_dim) const;
  // The probabilities alone: probs[M, H, L] = softmax_L(q · k^T / sqrt(D)). The drift
  // measurements run on it; the CPU backend computes it with the scalar kernel, bit for bit
  // what the drift-aware policies were validated with.
  virtual void AttentionProbabilities(const float* q, int64_t m, const float* k, int64_t l,
                                      int heads, int kv_heads, int head_dim,
                                      float* probs) const = 0;
  // gate[n] = silu(gate[n]) * up[n].
  virtual void SiluMul(float* gate, const float* up, int64_t n) const = 0;
  // x[n] += y[n].
  virtual void AddInPlace(float* x, const float* y, int64_t n) const = 0;
  // x[n] clamped to [-limit, limit].
  virtual void Clamp(float* x, int64_t n, float limit) const = 0;
  // Mixture-of-experts routing: chosen[M, k] and weights[M, k] for router logits[M, E]
  // (see ops.h RouteTopK). The choice stays in backend memory: GroupByExpert sorts the rows by
  // it.
  virtual void RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
                         float* weights) const = 0;
  // dst row r [width] += scales[p] * src row p for p = slots[r, 0], ..., slots[r, k - 1] in
  // that order (dst[M, width], slots[M, k] ascending and scales backend memory,
  // GroupByExpert's): the experts' outputs, weighted, into the rows that chose them, expert by
  // expert as the reference's index_add adds them.
  virtual void CombineExperts(const float* src, const float* scales, const int* slots, int64_t m,
                              int k, int64_t width, float* dst) const = 0;
  // dst row dst_rows[i] = src row src_rows[i] (rows of `width` floats); an empty list stands
  // for 0, 1, 2, ... so a gather passes no dst_rows and a scatter no src_rows. Row lists
  // are host memory; at least one must be non-empty, and both the same length when given.
  virtual void CopyRows(const float* src, std::span<const int> src_rows, float* dst,
                        std::span<const int> dst_rows, int64_t width) const = 0;
  // dst row i [width] = src row i, rows `*_stride` floats apart (both backend memory): a
  // block of rows laid into a wider (or out of a wider) matrix.
  virtual void CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                           int64_t rows, int64_t width) const = 0;
  // out[i, C] = embedding row of tokens[rows[i]] (tokens and rows host).
  virtual void Embed(const WeightView& embedding, std::span<const int> tokens,
                     std::span<const int> rows, float* out) const = 0;
  // logits[M, V] = lm_head · rmsnorm(x[M, C]); x is normalised in place. Segments as in
  // MatMulBatch.
  virtual void LmHeadBatch(float* x, RowSegments segments, int64_t c, const float* final_norm,
                           float eps, const WeightView& lm_head, float* logits) const = 0;
  void LmHead(float* x, int64_t m, int64_t c, const float* final_norm, float eps,
              const WeightView& lm_head, float* logits) const {
    const int64_t rows[] = {m};
    LmHeadBatch(x, rows, c, final_norm, eps, lm_head, logits);
  }
  // out[r] (host) = the mean over H heads of the drift between now and before, both
  // [rows, H, L] distributions: KL(now || before) with entries floored at 1e-12, or
  // 1 - cos(now, before). `logs` (backend memory) serves the KL only.
  virtual void HeadMeanDrift(DriftMetric metric, const float* now, const float* before,
                             int64_t rows, int heads, int64_t l, double* out,
                             DriftLogs logs = {}) const = 0;
  // The mean over rows i and keys j of cos(before[i, :, j], now[now_rows[i], :, j]), the
  // cosine taken across the H heads; before[|now_rows|, H, L], now[*, H, L].
  virtual double MeanCrossHeadCosine(const float* now, std::span<const int> now_rows,
                                     const float* before, int heads, int64_t l) const = 0;

  // Elastic-Cache's most-attended keys and the grouping of a mixture's rows by expert.

  // mass[L] (doubles) = per key j, the sum over the rows `rows` (host) of probs[*, H, L] and
  // over heads of probs[r, h, j], accumulated in double row by row in the list's order, head
  // by head: the attention the rows pay each key.
  virtual void AttentionMass(const float* probs, std::span<const int> rows, int heads, int64_t l,
                             double* mass) const = 0;
  // top[|top|] (host) = the |top| keys of `keys` (host, distinct, |top| <= |keys|) with the
  // largest mass[key], largest first, ties to the lower key.
  virtual void TopKeys(const double* mass, std::span<const int> keys, std::span<int> top) const = 0;
  // The rows of a routed batch grouped by expert (a stable counting sort of chosen[M, k]):
  // rows[M*k] and row_weights[M*k] hold expert 0's rows ascending with their weights[M, k],
  // then expert 1's, ...; counts[S, E] = how many rows of sequence s (the `segments`, host,
  // S of them, summing to M) chose expert e. An expert's rows are those of counts' column e,
  // and they start after the rows of the experts before it. slots[M, k] = where row r's
  // choices went in rows[], ascending (so in the order of their experts).
  virtual void GroupByExpert(const int* chosen, const float* weights, RowSegments segments,
                             int experts, int k, int* rows, float* row_weights, int* counts,
                             int* slots) const = 0;
  // dst row i [width] = src row rows[i], for i < n (rows[n] backend memory).
  virtual void GatherRows(const float* src, const int* rows, int64_t n, float* dst,
                          int64_t width) const = 0;

  // Polestar's clustering and hidden-state store, over backend memory (drift/drift.h has the
  // math, and the CPU backend runs that code: it is their scalar twin). Row lists are host.
  // Spherical k-means of points[n, d] with deterministic seeding: centroids[k, d] and
  // labels[n] (i32, in [0, k)).
  virtual void SphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                               float* centroids, int* labels) const = 0;
  // The centroid shift: pair i is now row now_rows[i] and before row i (before[|pairs|,
  // width]) of cluster labels[i]; each cluster a pair names moves by the sum of its pairs'
  // now - before over members[c] + 1e-6 (members host, [K]), unless it has no members.
  virtual void ShiftCentroids(const float* now, std::span<const int> now_rows, const float* before,
                              std::span<const int> labels, std::span<const float> members,
                              int64_t width, float* centroids) const = 0;
  // amax[1] = the largest |x row x_rows[i] - base row labels[i]|: an NVFP4 residual store's
  // tensor amax (drift.h Nvfp4TensorScale).
  virtual void ResidualAbsMax(const float* x, std::span<const int> x_rows, const float* base,
                              std::span<const int> labels, int64_t width, float* amax) const = 0;
  // An NVFP4 store of rows of `width` (drift/drift.h has the format): row r's E4M3 block
  // scales at scales[r * ceil(width / 16)] (u8), its E2M1 codes at values[r * ceil(width / 2)]
  // (u8), one FP32 tensor scale (host). Store row store_rows[i] = NVFP4 of (x row x_rows[i] -
  // base row labels[i]).
  virtual void QuantizeResiduals(const float* x, std::span<const int> x_rows, const float* base,
                                 std::span<const int> labels, int64_t width, float tensor_scale,
                                 uint8_t* scales, uint8_t* values,
                                 std::span<const int> store_rows) const = 0;
  // out row out_rows[i] = store row store_rows[i] dequantised + base row labels[i].
  virtual void DequantizeResiduals(const uint8_t* scales, const uint8_t* values,
                                   std::span<const int> store_rows, const float* base,
                                   std::span<const int> labels, int64_t width, float tensor_scale,
                                   float* out, std::span<const int> out_rows) const = 0;

  // out[M] (host) = the greedy choice of each row of logits[M, V] by `spec` (ops.h
  // GreedyChoiceOf: a commit rule's token and confidence at temperature 0, and the row's
  // first non-finite logit), so the rows need not cross to the host.
  virtual void GreedyChoices(const float* logits, int64_t m, int64_t vocab, const GreedySpec& spec,
                             GreedyChoice* out) const = 0;
};

}  // namespace polestar

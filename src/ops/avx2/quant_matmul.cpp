// AVX2 kernels for block-quantised weights: the dequantisers (bit-identical to the scalar
// DequantizeValues: the same multiply and subtract, no fused rounding); the fp32 matrix
// product, which dequantises a few weight rows into an L1-resident tile and multiplies it
// with every input row in a 4 x 2 register-blocked FMA kernel; and the integer matrix
// products (see ops/quant.h): activations rounded to 8 bits, weight levels times activation
// levels with maddubs / madd in exact int32 sums, one float scaling per weight
// (super-)block. Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "ops/avx2/simd.h"
#include "ops/quant.h"

namespace polestar::avx2 {
namespace {

float LoadF16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// Eight signed / unsigned bytes (the low 8 of `bytes`) to eight floats.
__m256 I8ToF32(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }
__m256 U8ToF32(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

// out[32] = scale * q - offset for 32 unsigned levels in a 256-bit register.
void StoreAffine32(__m256i levels, float scale, float offset, float* out) {
  const __m256 vs = _mm256_set1_ps(scale), vo = _mm256_set1_ps(offset);
  const __m128i lo = _mm256_castsi256_si128(levels), hi = _mm256_extracti128_si256(levels, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int p = 0; p < 4; ++p) {
    _mm256_storeu_ps(out + 8 * p, _mm256_sub_ps(_mm256_mul_ps(vs, U8ToF32(parts[p])), vo));
  }
}

// out[16] = scale * q for 16 signed levels in a 128-bit register.
void StoreScaled16(__m128i levels, float scale, float* out) {
  const __m256 vs = _mm256_set1_ps(scale);
  _mm256_storeu_ps(out, _mm256_mul_ps(vs, I8ToF32(levels)));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(vs, I8ToF32(_mm_srli_si128(levels, 8))));
}

void ScaleMinK4(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = uint8_t((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *min = uint8_t((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

void DequantizeQ8_0(const uint8_t* block, float* out) {
  const __m256 d = _mm256_set1_ps(LoadF16(block));
  for (int p = 0; p < 4; ++p) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + 8 * p));
    _mm256_storeu_ps(out + 8 * p, _mm256_mul_ps(I8ToF32(q), d));
  }
}

// The 32 unsigned nibbles of a Q4_0 block: the low nibbles of its 16 bytes, then the high.
__m256i Q4_0Nibbles(const uint8_t* block) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble),
                          _mm_and_si128(packed, nibble));
}

// The levels of the two 32-value sub-blocks of K-quant chunk `chunk` (64 values): Q4_K's
// nibbles, with Q5_K's fifth bits from qh[32] when `qh` is given.
void KQuantChunkLevels(const uint8_t* qs, const __m256i* qh, int chunk, __m256i* low,
                       __m256i* high) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * chunk));
  *low = _mm256_and_si256(packed, nibble);
  *high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
  if (qh == nullptr) return;
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (__m256i* levels : {low, high}) {
    const int bit_index = 2 * chunk + (levels == high ? 1 : 0);
    const __m256i bit = _mm256_set1_epi8(char(1 << bit_index));
    const __m256i fifth =
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(*qh, bit), bit), sixteen);
    *levels = _mm256_or_si256(*levels, fifth);
  }
}

// The unsigned 6-bit levels of Q6_K half `half` (128 values) as four groups of 32: the
// low / high nibbles of ql[0..32) / ql[32..64), each with two bits of qh.
void Q6KLevels(const uint8_t* block, int half, __m256i* groups) {
  const uint8_t* ql = block + 64 * half;
  const __m256i nibble = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
  const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
  groups[0] = _mm256_or_si256(_mm256_and_si256(ql0, nibble),
                              _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2));
  groups[1] = _mm256_or_si256(_mm256_and_si256(ql1, nibble),
                              _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2));
  groups[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), nibble),
                              _mm256_and_si256(qh, top2));
  groups[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), nibble),
                              _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2));
}

void DequantizeQ4_0(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  const __m256i levels = _mm256_sub_epi8(Q4_0Nibbles(block), _mm256_set1_epi8(8));
  // The scalar form is float(q) * d; multiplication commutes exactly.
  StoreScaled16(_mm256_castsi256_si128(levels), d, out);
  StoreScaled16(_mm256_extracti128_si256(levels, 1), d, out + 16);
}

void DequantizeQ4_K(const uint8_t* block, float* out) {
  const float d = LoadF16(block), dmin = LoadF16(block + 2);
  for (int chunk = 0; chunk < 4; ++chunk) {
    __m256i low, high;
    KQuantChunkLevels(block + 16, nullptr, chunk, &low, &high);
    uint8_t sc, m;
    ScaleMinK4(2 * chunk, block + 4, &sc, &m);
    StoreAffine32(low, d * sc, dmin * m, out + 64 * chunk);
    ScaleMinK4(2 * chunk + 1, block + 4, &sc, &m);
    StoreAffine32(high, d * sc, dmin * m, out + 64 * chunk + 32);
  }
}

void DequantizeQ5_K(const uint8_t* block, float* out) {
  const float d = LoadF16(block), dmin = LoadF16(block + 2);
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
  for (int chunk = 0; chunk < 4; ++chunk) {
    __m256i low, high;
    KQuantChunkLevels(block + 48, &qh, chunk, &low, &high);
    uint8_t sc, m;
    ScaleMinK4(2 * chunk, block + 4, &sc, &m);
    StoreAffine32(low, d * sc, dmin * m, out + 64 * chunk);
    ScaleMinK4(2 * chunk + 1, block + 4, &sc, &m);
    StoreAffine32(high, d * sc, dmin * m, out + 64 * chunk + 32);
  }
}

void DequantizeQ6_K(const uint8_t* block, float* out) {
  const float d = LoadF16(block + 208);
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const __m256i bias = _mm256_set1_epi8(32);
  for (int half = 0; half < 2; ++half) {
    __m256i groups[4];
    Q6KLevels(block, half, groups);
    const int8_t* sc = scales + 8 * half;
    float* o = out + 128 * half;
    for (int g = 0; g < 4; ++g) {
      const __m256i q = _mm256_sub_epi8(groups[g], bias);
      StoreScaled16(_mm256_castsi256_si128(q), d * float(sc[2 * g]), o + 32 * g);
      StoreScaled16(_mm256_extracti128_si256(q, 1), d * float(sc[2 * g + 1]), o + 32 * g + 16);
    }
  }
}

using BlockDequantizer = void (*)(const uint8_t*, float*);

BlockDequantizer DequantizerFor(DType type) {
  switch (type) {
    case DType::kQ8_0:
      return DequantizeQ8_0;
    case DType::kQ4_0:
      return DequantizeQ4_0;
    case DType::kQ4_K:
      return DequantizeQ4_K;
    case DType::kQ5_K:
      return DequantizeQ5_K;
    case DType::kQ6_K:
      return DequantizeQ6_K;
    default:
      return nullptr;
  }
}

// --- fp32 activations against dequantised weight tiles ---

// y[r * ldy + c] = x_r · w_c for kRows input rows (ldx apart) and kCols weight rows (K
// apart); K is a multiple of 8.
template <int kRows, int kCols>
void DotTile(const float* x, int64_t ldx, const float* w, int64_t k, float* y, int64_t ldy) {
  __m256 acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < k; j += 8) {
    __m256 wv[kCols];
    for (int c = 0; c < kCols; ++c) wv[c] = _mm256_loadu_ps(w + c * k + j);
    for (int r = 0; r < kRows; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + j);
      for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) y[r * ldy + c] = HorizontalSum(acc[r][c]);
  }
}

template <int kCols>
void DotRows(const float* x, int64_t m, const float* w, int64_t k, float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) DotTile<4, kCols>(x + i * k, k, w, k, y + i * ldy, ldy);
  for (; i < m; ++i) DotTile<1, kCols>(x + i * k, k, w, k, y + i * ldy, ldy);
}

// --- activations to 8 bits ---

int HorizontalSumI32(__m256i v) {
  __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(sum);
}

// --- weight rows unpacked for the integer kernels, once per row and matmul call ---

// A Q8_0 / Q4_0 row. maddubs multiplies unsigned by signed bytes, so the kernel multiplies
// |w| by x carrying w's sign (_mm256_sign_epi8): w * x either way.
struct Levels32Row {
  std::vector<int8_t> levels;       // [K] signed levels: Q8_0's bytes, Q4_0's nibbles - 8
  std::vector<uint8_t> magnitudes;  // [K] |levels|: 128 for a Q8_0 byte of -128
  std::vector<float> scales;        // [K / 32]
};

void Unpack(DType type, const uint8_t* row, int64_t k, Levels32Row* out) {
  out->levels.resize(size_t(k));
  out->magnitudes.resize(size_t(k));
  out->scales.resize(size_t(k / 32));
  WeightLevels(type, row, k, reinterpret_cast<uint8_t*>(out->levels.data()));
  for (int64_t j = 0; j < k; j += 32) {
    const __m256i levels =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&out->levels[size_t(j)]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out->magnitudes[size_t(j)]),
                        _mm256_abs_epi8(levels));
  }
  for (int64_t b = 0; b < k / 32; ++b) out->scales[size_t(b)] = LoadF16(row + b * BlockBytes(type));
}

// A Q4_K / Q5_K / Q6_K row (see KQuantMultipliers).
struct KQuantRow {
  std::vector<uint8_t> levels;       // [K] unsigned levels
  std::vector<int16_t> multipliers;  // [K / 32, 16]: madd's factors for 32 values, int16
                                     // lanes 0-7 the scale of values 0-15, lanes 8-15 of 16-31
  std::vector<int16_t> mins;         // [K / 16]
  std::vector<float> d, dmin;        // [K / 256]
};

void Unpack(DType type, const uint8_t* row, int64_t k, KQuantRow* out) {
  out->levels.resize(size_t(k));
  out->multipliers.resize(size_t(k / 2));
  out->mins.resize(size_t(k / 16));
  out->d.resize(size_t(k / 256));
  out->dmin.resize(size_t(k / 256));
  WeightLevels(type, row, k, out->levels.data());
  for (int64_t b = 0; b < k / 256; ++b) {
    const KQuantMultipliers mul = KQuantMultipliersOf(type, row + b * BlockBytes(type));
    for (int g = 0; g < 8; ++g) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out->multipliers[size_t(128 * b + 16 * g)]),
                          _mm256_set_m128i(_mm_set1_epi16(mul.scales[2 * g + 1]),
                                           _mm_set1_epi16(mul.scales[2 * g])));
    }
    std::memcpy(&out->mins[size_t(16 * b)], mul.mins, sizeof(mul.mins));
    out->d[size_t(b)] = mul.d;
    out->dmin[size_t(b)] = mul.dmin;
  }
}

// --- register tiles: kRows activation rows (K apart from xq) against kCols unpacked weight
// rows, y[r * ldy + c]. Every (r, c) pair runs the same operations in every tile shape, so
// results do not depend on where tiles or thread chunks fall. ---

// Why maddubs (pairs of u8 * s8 summed into saturating int16) never saturates: activation
// levels lie in [-127, 127] (QuantizeActivations never writes -128), so a pair is at most
// 2 * 127 * max(weight operand): Q8_0 / Q4_0 |w| <= 128 (a Q8_0 byte of -128; the sign
// trick negates x, never w, so -128 is not negated) gives 32512; Q4_K levels <= 15 give
// 3810, Q5_K <= 31 7874, Q6_K <= 63 16002, all below 32767 whatever the weight bytes.

template <int kRows, int kCols>
void Tile(const QuantizedActivations& x, int64_t i0, const Levels32Row* w, float* y, int64_t ldy) {
  const int64_t k = x.cols, blocks = k / 32;
  const int8_t* xq = &x.q[size_t(i0 * k)];
  const float* x_scales = &x.scales[size_t(i0 * blocks)];
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kRows][kCols];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i levels[kCols], magnitudes[kCols];
    for (int c = 0; c < kCols; ++c) {
      levels[c] =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w[c].levels[size_t(32 * b)]));
      magnitudes[c] =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w[c].magnitudes[size_t(32 * b)]));
    }
    for (int r = 0; r < kRows; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * k + 32 * b));
      const float dx = x_scales[r * blocks + b];
      for (int c = 0; c < kCols; ++c) {
        const __m256i pairs = _mm256_maddubs_epi16(magnitudes[c], _mm256_sign_epi8(xv, levels[c]));
        const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r][c] = _mm256_fmadd_ps(dots, _mm256_set1_ps(w[c].scales[size_t(b)] * dx), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) y[r * ldy + c] = HorizontalSum(acc[r][c]);
  }
}

template <int kRows, int kCols>
void Tile(const QuantizedActivations& x, int64_t i0, const KQuantRow* w, float* y, int64_t ldy) {
  const int64_t k = x.cols, blocks = k / 256;
  const int8_t* xq = &x.q[size_t(i0 * k)];
  const float* x_scales = &x.scales[size_t(i0 * blocks)];
  const int16_t* x_sums = &x.group_sums[size_t(i0 * k / 16)];
  __m256 acc[kRows][kCols];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    // Integer within the super-block: madd applies each group's 6/8-bit scale to the int16
    // pair sums (|scale * pair| <= 128 * 16002, far inside int32).
    __m256i dots[kRows][kCols];
    for (auto& row : dots) {
      for (auto& d : row) d = _mm256_setzero_si256();
    }
    for (int g = 0; g < 8; ++g) {
      const size_t j = size_t(256 * b + 32 * g);
      __m256i levels[kCols], multipliers[kCols];
      for (int c = 0; c < kCols; ++c) {
        levels[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w[c].levels[j]));
        multipliers[c] =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w[c].multipliers[j / 2]));
      }
      for (int r = 0; r < kRows; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * k + j));
        for (int c = 0; c < kCols; ++c) {
          const __m256i pairs = _mm256_maddubs_epi16(levels[c], xv);
          dots[r][c] = _mm256_add_epi32(dots[r][c], _mm256_madd_epi16(pairs, multipliers[c]));
        }
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const __m256i sums =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_sums + r * (k / 16) + 16 * b));
      const float dx = x_scales[r * blocks + b];
      for (int c = 0; c < kCols; ++c) {
        const __m256i min_dots = _mm256_madd_epi16(
            sums, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w[c].mins[size_t(16 * b)])));
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r][c]),
                                    _mm256_set1_ps(w[c].d[size_t(b)] * dx), acc[r][c]);
        acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(min_dots),
                                     _mm256_set1_ps(w[c].dmin[size_t(b)] * dx), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) y[r * ldy + c] = HorizontalSum(acc[r][c]);
  }
}

constexpr int kTileRows = 4, kTileCols = 2;

template <class Row, int kRows>
void TileOfRows(int cols, const QuantizedActivations& x, int64_t i0, const Row* w, float* y,
                int64_t ldy) {
  if (cols == 2) {
    Tile<kRows, 2>(x, i0, w, y, ldy);
  } else {
    Tile<kRows, 1>(x, i0, w, y, ldy);
  }
}

// Weight rows kTileCols at a time are unpacked once, then run against every activation row.
template <class Row>
void Columns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin, int64_t n_end,
             float* y, int64_t ldy) {
  Row rows[kTileCols];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileCols) {
    const int cols = int(std::min<int64_t>(kTileCols, n_end - n0));
    for (int c = 0; c < cols; ++c) Unpack(w.dtype, w.Row(n0 + c), w.cols, &rows[c]);
    float* y_tile = y + (n0 - n_begin);
    for (int64_t i0 = 0; i0 < x.rows; i0 += kTileRows) {
      float* y_rows = y_tile + i0 * ldy;
      switch (std::min<int64_t>(kTileRows, x.rows - i0)) {
        case 4:
          TileOfRows<Row, 4>(cols, x, i0, rows, y_rows, ldy);
          break;
        case 3:
          TileOfRows<Row, 3>(cols, x, i0, rows, y_rows, ldy);
          break;
        case 2:
          TileOfRows<Row, 2>(cols, x, i0, rows, y_rows, ldy);
          break;
        default:
          TileOfRows<Row, 1>(cols, x, i0, rows, y_rows, ldy);
          break;
      }
    }
  }
}
}  // namespace

void DequantizeValues(DType type, const uint8_t* src, int64_t n, float* out) {
  const BlockDequantizer fn = DequantizerFor(type);
  PS_CHECK(fn != nullptr && n % BlockSize(type) == 0);
  const int block_size = BlockSize(type), block_bytes = BlockBytes(type);
  for (int64_t b = 0; b < n / block_size; ++b) fn(src + b * block_bytes, out + b * block_size);
}

void QuantMatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin,
                        int64_t n_end, float* y, int64_t ldy) {
  constexpr int64_t kTileRows = 8;  // weight rows dequantised together
  const int64_t k = w.cols;
  std::vector<float> tile(static_cast<size_t>(kTileRows * k));  // [kTileRows, K]
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, n_end - n0);
    for (int64_t r = 0; r < rows; ++r)
      avx2::DequantizeValues(w.dtype, w.Row(n0 + r), k, &tile[r * k]);
    float* y_tile = y + (n0 - n_begin);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) DotRows<2>(x, m, &tile[r * k], k, y_tile + r, ldy);
    if (r < rows) DotRows<1>(x, m, &tile[r * k], k, y_tile + r, ldy);
  }
}

void WeightLevels(DType type, const uint8_t* row, int64_t k, uint8_t* levels) {
  const int block_bytes = BlockBytes(type);
  if (BlockSize(type) == 32) {
    for (int64_t b = 0; b < k / 32; ++b) {
      const uint8_t* block = row + b * block_bytes;
      const __m256i signed_levels =
          type == DType::kQ8_0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2))
                               : _mm256_sub_epi8(Q4_0Nibbles(block), _mm256_set1_epi8(8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels + 32 * b), signed_levels);
    }
    return;
  }
  for (int64_t b = 0; b < k / 256; ++b) {
    const uint8_t* block = row + b * block_bytes;
    __m256i groups[8];  // 32 levels each, in value order
    if (type == DType::kQ6_K) {
      Q6KLevels(block, 0, groups);
      Q6KLevels(block, 1, groups + 4);
    } else {
      const bool five_bits = type == DType::kQ5_K;
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
      for (int chunk = 0; chunk < 4; ++chunk) {
        KQuantChunkLevels(block + (five_bits ? 48 : 16), five_bits ? &qh : nullptr, chunk,
                          &groups[2 * chunk], &groups[2 * chunk + 1]);
      }
    }
    for (int g = 0; g < 8; ++g) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels + 256 * b + 32 * g), groups[g]);
    }
  }
}

void QuantizeActivations(const float* x, int64_t m, int64_t k, int block,
                         QuantizedActivations* out) {
  PS_CHECK(block % 32 == 0);  // whole 32-value vectors per block
  out->Reshape(m, k, block);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // Packing 4 x 8 int32 to 32 bytes interleaves 128-bit lanes; this puts them back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < m * k / block; ++b) {
    const float* xb = x + b * block;
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < block; j += 8)
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
    // The same float operations as the scalar quantiser: max is exact in any order.
    const float max_abs = HorizontalMax(amax);
    const __m256 inverse = _mm256_set1_ps(max_abs != 0 ? 127.0f / max_abs : 0.0f);
    out->scales[size_t(b)] = max_abs / 127;
    for (int j = 0; j < block; j += 32) {
      __m256i q[4];
      for (int p = 0; p < 4; ++p) {
        const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * p), inverse);
        q[p] = _mm256_cvttps_epi32(
            _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      const __m256i packed =
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      const int64_t at = b * block + j;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out->q[size_t(at)]),
                          _mm256_permutevar8x32_epi32(packed, order));
      out->group_sums[size_t(at / 16)] = int16_t(HorizontalSumI32(_mm256_add_epi32(q[0], q[1])));
      out->group_sums[size_t(at / 16 + 1)] =
          int16_t(HorizontalSumI32(_mm256_add_epi32(q[2], q[3])));
    }
  }
}

void QuantDotColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy) {
  PS_CHECK(x.cols == w.cols && x.block == ActivationBlock(w.dtype));
  if (BlockSize(w.dtype) == 32) {
    Columns<Levels32Row>(x, w, n_begin, n_end, y, ldy);
  } else {
    Columns<KQuantRow>(x, w, n_begin, n_end, y, ldy);
  }
}

}  // namespace polestar::avx2

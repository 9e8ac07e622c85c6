// Scalar block formats. The quantisers follow ggml's reference quantisers operation by
// operation (same float expressions in the same order, no contraction: this file is built
// with -ffp-contract=off) so converted files match ggml's byte for byte.
#include "ops/quant.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "ops/avx2/avx2.h"
#include "ops/reference.h"

namespace polestar {
namespace {

constexpr int kQK = 256;  // values per K-quant super-block

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// ggml's nearest_int: adding 1.5 * 2^23 leaves the rounded integer (ties to even) in the
// low mantissa bits. Reproduced literally, out-of-range inputs included.
int NearestInt(float value) {
  const float shifted = value + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block.
void ScaleMinK4(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = uint8_t((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *min = uint8_t((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// --- dequantisation, one block at a time ---

void DequantizeQ8_0(const uint8_t* block, float* out) {
  const float d = F16ToF32(LoadU16(block));
  const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
  for (int j = 0; j < 32; ++j) out[j] = float(qs[j]) * d;
}

void DequantizeQ4_0(const uint8_t* block, float* out) {
  const float d = F16ToF32(LoadU16(block));
  const uint8_t* qs = block + 2;
  for (int j = 0; j < 16; ++j) {
    out[j] = float((qs[j] & 0xF) - 8) * d;
    out[j + 16] = float((qs[j] >> 4) - 8) * d;
  }
}

void DequantizeQ4_K(const uint8_t* block, float* out) {
  const float d = F16ToF32(LoadU16(block));
  const float dmin = F16ToF32(LoadU16(block + 2));
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + 16;
  for (int chunk = 0; chunk < 4; ++chunk) {  // 64 values: two sub-blocks sharing 32 bytes
    uint8_t sc, m;
    ScaleMinK4(2 * chunk, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    ScaleMinK4(2 * chunk + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) out[l] = d1 * float(qs[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) out[l + 32] = d2 * float(qs[l] >> 4) - m2;
    qs += 32;
    out += 64;
  }
}

void DequantizeQ5_K(const uint8_t* block, float* out) {
  const float d = F16ToF32(LoadU16(block));
  const float dmin = F16ToF32(LoadU16(block + 2));
  const uint8_t* scales = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + 48;
  for (int chunk = 0; chunk < 4; ++chunk) {
    uint8_t sc, m;
    ScaleMinK4(2 * chunk, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    ScaleMinK4(2 * chunk + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    const int low_bit = 2 * chunk, high_bit = 2 * chunk + 1;  // bits of qh for this chunk
    for (int l = 0; l < 32; ++l) {
      out[l] = d1 * float((qs[l] & 0xF) + (((qh[l] >> low_bit) & 1) << 4)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      out[l + 32] = d2 * float((qs[l] >> 4) + (((qh[l] >> high_bit) & 1) << 4)) - m2;
    }
    qs += 32;
    out += 64;
  }
}

void DequantizeQ6_K(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = F16ToF32(LoadU16(block + 208));
  for (int half = 0; half < 2; ++half) {  // 128 values: ql[64], qh[32], scales[8]
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * float(scales[s]) * float(q1);
      out[l + 32] = d * float(scales[s + 2]) * float(q2);
      out[l + 64] = d * float(scales[s + 4]) * float(q3);
      out[l + 96] = d * float(scales[s + 6]) * float(q4);
    }
    ql += 64;
    qh += 32;
    scales += 8;
    out += 128;
  }
}

// --- weight levels as the integer kernels multiply them ---

// The signed levels of a Q8_0 / Q4_0 block (y = d * level); returns d.
float BlockLevels32(DType type, const uint8_t* block, int8_t* levels) {
  if (type == DType::kQ8_0) {
    std::memcpy(levels, block + 2, 32);
  } else {
    for (int j = 0; j < 16; ++j) {
      levels[j] = int8_t((block[2 + j] & 0xF) - 8);
      levels[j + 16] = int8_t((block[2 + j] >> 4) - 8);
    }
  }
  return F16ToF32(LoadU16(block));
}

// The unsigned levels[256] of a K-quant super-block (see KQuantMultipliers).
void KQuantLevels(DType type, const uint8_t* block, uint8_t* levels) {
  if (type == DType::kQ6_K) {
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block + 64 * half;
      const uint8_t* qh = block + 128 + 32 * half;
      uint8_t* out = levels + 128 * half;
      for (int l = 0; l < 32; ++l) {
        out[l] = uint8_t((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
        out[l + 32] = uint8_t((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        out[l + 64] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        out[l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    return;
  }
  const bool five_bits = type == DType::kQ5_K;
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + (five_bits ? 48 : 16);
  for (int chunk = 0; chunk < 4; ++chunk) {  // 64 values: two sub-blocks sharing 32 bytes
    for (int l = 0; l < 32; ++l) {
      const int high_low = five_bits ? ((qh[l] >> (2 * chunk)) & 1) << 4 : 0;
      const int high_high = five_bits ? ((qh[l] >> (2 * chunk + 1)) & 1) << 4 : 0;
      levels[64 * chunk + l] = uint8_t((qs[32 * chunk + l] & 0xF) | high_low);
      levels[64 * chunk + 32 + l] = uint8_t((qs[32 * chunk + l] >> 4) | high_high);
    }
  }
}

// --- quantisation helpers (ggml's make_qkx2_quants and make_qx_quants) ---

// Fits x[n] ~ scale * L - min with L in [0, nmax], minimising the weighted squared error
// over a sweep of candidate scales. Returns the scale; *neg_min receives the (non-negative)
// min. L receives the levels.
float FitScaleMin(int n, int nmax, const float* x, const float* weights, uint8_t* levels,
                  float* neg_min, float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(levels, levels + n, uint8_t{0});
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    levels[i] = uint8_t(std::max(0, std::min(nmax, l)));
    const float diff = scale * float(levels[i]) + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  uint8_t trial[32];  // [n]
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * float(step) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, NearestInt(iscale * (x[i] - min))));
      trial[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * float(l);
      sum_l2 += w * float(l) * float(l);
      sum_xl += w * float(l) * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * float(trial[i]) + this_min - x[i];
        error += weights[i] * (diff * diff);
      }
      if (error < best_error) {
        std::copy(trial, trial + n, levels);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Fits x[n] ~ scale * (L - nmax) with L in [0, 2*nmax), weights x^2, trying 19 scales
// around nmax / max|x|. Returns the (signed) scale.
float FitSymmetricScale(int n, int nmax, const float* x, int8_t* levels) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(levels, levels + n, int8_t{0});
    return 0.0f;
  }
  auto level = [&](float iscale, int i) {
    return std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
  };
  float iscale = float(-nmax) / max;
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, i);
    levels[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * float(l);
    sum_l2 += w * float(l) * float(l);
  }
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(step)) / max;
    sum_lx = sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, i);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * float(l);
      sum_l2 += w * float(l) * float(l);
    }
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      for (int i = 0; i < n; ++i) levels[i] = int8_t(level(iscale, i) + nmax);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

// --- quantisation, one block at a time ---

void QuantizeQ8_0(const float* x, uint8_t* block) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  StoreU16(block, F32ToF16(d));
  for (int j = 0; j < 32; ++j) block[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
}

void QuantizeQ4_0(const float* x, uint8_t* block) {
  float amax = 0.0f, max = 0.0f;  // max: the signed value of largest magnitude
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  StoreU16(block, F32ToF16(d));
  for (int j = 0; j < 16; ++j) {
    // ggml truncates x*id + 8.5 toward zero, i.e. rounds half up within [0, 16].
    const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
    block[2 + j] = uint8_t(lo | (hi << 4));
  }
}

// Shared by Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins; writes d, dmin
// and scales[12] into `header` (16 bytes) and the levels into L[256].
void QuantizeScalesK(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* header,
                     uint8_t* levels) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
    scales[j] = FitScaleMin(32, nmax, xj, weights, levels + 32 * j, &mins[j], rmin, rdelta, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* packed = header + 4;  // scales[12]
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, uint8_t(NearestInt(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, uint8_t(NearestInt(inv_min * mins[j])));
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {  // low 4 bits in bytes 8..11, high 2 bits in the top of bytes 0..7
      packed[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] |= uint8_t((ls >> 4) << 6);
      packed[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  StoreU16(header, F32ToF16(max_scale / 63.f));
  StoreU16(header + 2, F32ToF16(max_min / 63.f));
  // Re-derive the levels against the rounded scales.
  const float d = F16ToF32(LoadU16(header));
  const float dmin = F16ToF32(LoadU16(header + 2));
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ScaleMinK4(j, packed, &sc, &m);
    const float dj = d * sc;
    if (dj == 0) continue;
    const float mj = dmin * m;
    for (int l = 0; l < 32; ++l) {
      const int q = NearestInt((x[32 * j + l] + mj) / dj);
      levels[32 * j + l] = uint8_t(std::max(0, std::min(nmax, q)));
    }
  }
}

void QuantizeQ4_K(const float* x, uint8_t* block) {
  uint8_t levels[kQK];
  QuantizeScalesK(x, 15, -1.0f, 0.1f, 20, block, levels);
  uint8_t* qs = block + 16;
  for (int chunk = 0; chunk < 4; ++chunk) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * chunk + l] = uint8_t(levels[64 * chunk + l] | (levels[64 * chunk + 32 + l] << 4));
    }
  }
}

void QuantizeQ5_K(const float* x, uint8_t* block) {
  uint8_t levels[kQK];
  QuantizeScalesK(x, 31, -0.5f, 0.1f, 15, block, levels);
  uint8_t* qh = block + 16;
  uint8_t* qs = block + 48;
  std::memset(qh, 0, 32);
  for (int chunk = 0; chunk < 4; ++chunk) {
    for (int l = 0; l < 32; ++l) {
      const int lo = levels[64 * chunk + l], hi = levels[64 * chunk + 32 + l];
      qh[l] |= uint8_t(((lo >> 4) << (2 * chunk)) | ((hi >> 4) << (2 * chunk + 1)));
      qs[32 * chunk + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
    }
  }
}

void QuantizeQ6_K(const float* x, uint8_t* block) {
  int8_t levels[kQK];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int s = 0; s < 16; ++s) {
    scales[s] = FitSymmetricScale(16, 32, x + 16 * s, levels + 16 * s);
    if (std::fabs(scales[s]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[s]);
      max_scale = scales[s];
    }
  }
  std::memset(block, 0, 210);
  if (max_abs_scale < 1e-15f) return;  // all zero: d = 0
  uint8_t* ql = block;
  uint8_t* qh = block + 128;
  int8_t* block_scales = reinterpret_cast<int8_t*>(block + 192);
  const float iscale = -128.f / max_scale;
  StoreU16(block + 208, F32ToF16(1 / iscale));
  for (int s = 0; s < 16; ++s)
    block_scales[s] = int8_t(std::min(127, NearestInt(iscale * scales[s])));
  const float d = F16ToF32(LoadU16(block + 208));
  for (int s = 0; s < 16; ++s) {
    const float ds = d * float(block_scales[s]);
    if (ds == 0) continue;
    for (int l = 0; l < 16; ++l) {
      const int q = NearestInt(x[16 * s + l] / ds);
      levels[16 * s + l] = int8_t(std::max(-32, std::min(31, q)) + 32);
    }
  }
  for (int half = 0; half < 2; ++half) {
    const int8_t* L = levels + 128 * half;
    for (int l = 0; l < 32; ++l) {
      ql[l] = uint8_t((L[l] & 0xF) | ((L[l + 64] & 0xF) << 4));
      ql[l + 32] = uint8_t((L[l + 32] & 0xF) | ((L[l + 96] & 0xF) << 4));
      qh[l] = uint8_t((L[l] >> 4) | ((L[l + 32] >> 4) << 2) | ((L[l + 64] >> 4) << 4) |
                      ((L[l + 96] >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

}  // namespace

bool IsBlockQuantized(DType type) {
  switch (type) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void DequantizeValues(DType type, const uint8_t* src, int64_t n, float* out) {
  PS_CHECK(n % BlockSize(type) == 0);
  const int64_t blocks = n / BlockSize(type);
  const int block_bytes = BlockBytes(type);
  void (*block_fn)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case DType::kF32:
      std::memcpy(out, src, size_t(n) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(LoadU16(src + 2 * i));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(LoadU16(src + 2 * i));
      return;
    case DType::kQ8_0:
      block_fn = DequantizeQ8_0;
      break;
    case DType::kQ4_0:
      block_fn = DequantizeQ4_0;
      break;
    case DType::kQ4_K:
      block_fn = DequantizeQ4_K;
      break;
    case DType::kQ5_K:
      block_fn = DequantizeQ5_K;
      break;
    case DType::kQ6_K:
      block_fn = DequantizeQ6_K;
      break;
    default:
      Fail("no dequantisation for weight type ", DTypeName(type));
  }
  for (int64_t b = 0; b < blocks; ++b) {
    block_fn(src + b * block_bytes, out + b * BlockSize(type));
  }
}

void QuantizeValues(DType type, const float* src, int64_t n, uint8_t* dst) {
  PS_CHECK(n % BlockSize(type) == 0);
  const int64_t blocks = n / BlockSize(type);
  const int block_bytes = BlockBytes(type);
  void (*block_fn)(const float*, uint8_t*) = nullptr;
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(dst + 2 * i, F32ToF16(src[i]));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(dst + 2 * i, F32ToBf16(src[i]));
      return;
    case DType::kQ8_0:
      block_fn = QuantizeQ8_0;
      break;
    case DType::kQ4_0:
      block_fn = QuantizeQ4_0;
      break;
    case DType::kQ4_K:
      block_fn = QuantizeQ4_K;
      break;
    case DType::kQ5_K:
      block_fn = QuantizeQ5_K;
      break;
    case DType::kQ6_K:
      block_fn = QuantizeQ6_K;
      break;
    default:
      Fail("no quantiser for weight type ", DTypeName(type));
  }
  for (int64_t b = 0; b < blocks; ++b) {
    block_fn(src + b * BlockSize(type), dst + b * block_bytes);
  }
}

int ActivationBlock(DType weight_type) { return BlockSize(weight_type) == 32 ? 32 : kQK; }

void QuantizedActivations::Reshape(int64_t m, int64_t k, int block_values) {
  PS_CHECK(block_values % 16 == 0 && k % block_values == 0);
  rows = m;
  cols = k;
  block = block_values;
  q.resize(size_t(m * k));
  scales.resize(size_t(m * k / block_values));
  group_sums.resize(size_t(m * k / 16));
}

void QuantizeActivations(const float* x, int64_t m, int64_t k, int block,
                         QuantizedActivations* out) {
  out->Reshape(m, k, block);
  for (int64_t b = 0; b < m * k / block; ++b) {  // K is a multiple of block: rows hold whole blocks
    const float* xb = x + b * block;
    float amax = 0.0f;
    for (int j = 0; j < block; ++j) amax = std::max(amax, std::fabs(xb[j]));
    // x * (127 / amax) <= 127 * (1 + 2^-23) < 127.5, so the levels need no clamp.
    const float inverse = amax != 0 ? 127.0f / amax : 0.0f;
    out->scales[size_t(b)] = amax / 127;
    for (int j = 0; j < block; ++j) {
      out->q[size_t(b * block + j)] = int8_t(std::nearbyint(xb[j] * inverse));
    }
  }
  for (int64_t g = 0; g < m * k / 16; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += out->q[size_t(16 * g + j)];
    out->group_sums[size_t(g)] = int16_t(sum);
  }
}

KQuantMultipliers KQuantMultipliersOf(DType type, const uint8_t* block) {
  KQuantMultipliers mul;
  if (type == DType::kQ6_K) {
    mul.d = mul.dmin = F16ToF32(LoadU16(block + 208));
    const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
    for (int g = 0; g < 16; ++g) {
      mul.scales[g] = scales[g];
      mul.mins[g] = int16_t(32 * scales[g]);  // d * sc * (q - 32) = d * sc * q - d * 32 * sc
    }
    return mul;
  }
  PS_CHECK(type == DType::kQ4_K || type == DType::kQ5_K);
  mul.d = F16ToF32(LoadU16(block));
  mul.dmin = F16ToF32(LoadU16(block + 2));
  // ScaleMinK4 four sub-blocks at a time, one byte each in a 32-bit word: bytes 0-3 hold
  // scales 0-3 (low 6 bits), bytes 4-7 mins 0-3, bytes 8-11 the low nibbles of scales 4-7
  // (low) and mins 4-7 (high), whose top two bits are the top bits of bytes 0-3 / 4-7.
  uint32_t words[3];  // scales[12]
  std::memcpy(words, block + 4, 12);
  const uint32_t six = 0x3f3f3f3f, nibble = 0x0f0f0f0f, two = 0x03030303;
  const uint32_t packed[4] = {
      words[0] & six,                                               // scales 0-3
      (words[2] & nibble) | (((words[0] >> 6) & two) << 4),         // scales 4-7
      words[1] & six,                                               // mins 0-3
      ((words[2] >> 4) & nibble) | (((words[1] >> 6) & two) << 4),  // mins 4-7
  };
  uint8_t bytes[16];  // scales 0-7, mins 0-7
  std::memcpy(bytes, packed, 16);
  for (int j = 0; j < 8; ++j) {  // sub-blocks of 32: two groups of 16 each
    mul.scales[2 * j] = mul.scales[2 * j + 1] = bytes[j];
    mul.mins[2 * j] = mul.mins[2 * j + 1] = bytes[8 + j];
  }
  return mul;
}

void QuantDotColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy) {
  const int64_t k = w.cols;
  const int block = BlockSize(w.dtype), block_bytes = BlockBytes(w.dtype);
  PS_CHECK(x.cols == k && x.block == ActivationBlock(w.dtype));
  const int64_t blocks = k / block;
  for (int64_t n = n_begin; n < n_end; ++n) {
    for (int64_t i = 0; i < x.rows; ++i) {
      const int8_t* xq = &x.q[size_t(i * k)];
      const float* x_scales = &x.scales[size_t(i * blocks)];
      const int16_t* x_sums = &x.group_sums[size_t(i * k / 16)];
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* wb = w.Row(n) + b * block_bytes;
        const int8_t* qb = xq + b * block;
        if (block == 32) {
          int8_t levels[32];
          const float d = BlockLevels32(w.dtype, wb, levels);
          int32_t dot = 0;
          for (int j = 0; j < 32; ++j) dot += levels[j] * qb[j];
          acc += (d * x_scales[b]) * float(dot);
        } else {
          uint8_t levels[kQK];
          KQuantLevels(w.dtype, wb, levels);
          const KQuantMultipliers mul = KQuantMultipliersOf(w.dtype, wb);
          int32_t dot = 0, min_dot = 0;
          for (int g = 0; g < 16; ++g) {
            int32_t group_dot = 0;
            for (int l = 0; l < 16; ++l) group_dot += levels[16 * g + l] * qb[16 * g + l];
            dot += mul.scales[g] * group_dot;
            min_dot += mul.mins[g] * x_sums[16 * b + g];
          }
          acc += (mul.d * x_scales[b]) * float(dot) - (mul.dmin * x_scales[b]) * float(min_dot);
        }
      }
      y[i * ldy + (n - n_begin)] = acc;
    }
  }
}

bool QuantMatMul(const float* x, int64_t m, const WeightView& w, float* y, const float* bias,
                 Isa isa, ActivationPrecision activations) {
  if (!IsBlockQuantized(w.dtype)) return false;
  if (activations == ActivationPrecision::kF32) {
    // Each chunk of output columns dequantises its own weight rows once and reuses them for
    // all M inputs, so the grain keeps a chunk's rows a few hundred KB of quantised data.
    const int64_t grain = std::max<int64_t>(8, 65536 / std::max<int64_t>(w.row_bytes, 1));
    ParallelFor(w.rows, grain, [&](int64_t n_begin, int64_t n_end) {
      if (isa >= Isa::kAvx2) {
        avx2::QuantMatMulColumns(x, m, w, n_begin, n_end, y + n_begin, w.rows);
      } else {
        reference::MatMulColumns(x, m, w, n_begin, n_end, y + n_begin, w.rows);
      }
    });
  } else {
    // Quantised once per call (serially: a few hundredths of the products' work), then read
    // by every thread; kept per calling thread so steady decoding allocates nothing.
    thread_local QuantizedActivations quantized;
    const int block = ActivationBlock(w.dtype);
    if (isa >= Isa::kAvx2) {
      avx2::QuantizeActivations(x, m, w.cols, block, &quantized);
    } else {
      QuantizeActivations(x, m, w.cols, block, &quantized);
    }
    auto* columns = isa >= Isa::kAvx512 ? avx512::QuantDotColumns
                    : isa >= Isa::kAvx2 ? avx2::QuantDotColumns
                                        : QuantDotColumns;
    // Every chunk unpacks its weight rows once and reuses them for all M rows, so a chunk
    // holds at least a few tiles of columns.
    const int64_t grain =
        std::max<int64_t>(8, (int64_t(1) << 18) / std::max<int64_t>(m * w.cols, 1));
    const QuantizedActivations& xq = quantized;
    ParallelFor(w.rows, grain, [&](int64_t n_begin, int64_t n_end) {
      columns(xq, w, n_begin, n_end, y + n_begin, w.rows);
    });
  }
  if (bias != nullptr) {
    // The bias add is exact, so the scalar loop matches the AVX2 one bit for bit.
    for (int64_t i = 0; i < m; ++i) reference::AddInPlace(y + i * w.rows, bias, w.rows);
  }
  return true;
}

}  // namespace polestar

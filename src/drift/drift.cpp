#include "drift/drift.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "ops/ops.h"

namespace polestar {

Clustering SphericalKMeans(std::span<const float> points, int64_t n, int64_t d, int k,
                           int iterations) {
  PS_CHECK(int64_t(points.size()) == n * d && k > 0 && n > 0);
  Clustering result;
  result.centroids.resize(size_t(k * d));
  result.labels.resize(size_t(n));
  SphericalKMeans(points.data(), n, d, k, iterations, result.centroids.data(),
                  result.labels.data());
  return result;
}

void SphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                     float* centroids, int* labels) {
  PS_CHECK(k > 0 && n > 0);
  if (n <= k) {
    for (int c = 0; c < k; ++c) std::memcpy(&centroids[c * d], &points[(c % n) * d], size_t(d) * 4);
    for (int64_t i = 0; i < n; ++i) labels[i] = int(i);
    return;
  }
  // The unit points widened to double and stored dimension-major, so the similarities run
  // over points side by side (DimensionMajorDots): every similarity still sums its d
  // products in order, so the result is the plain double loop's, bit for bit.
  std::vector<double> unit_by_dim(static_cast<size_t>(d * n));  // [d, n]
  for (int64_t i = 0; i < n; ++i) {
    const float* row = &points[i * d];
    double norm = 0;
    for (int64_t j = 0; j < d; ++j) norm += double(row[j]) * row[j];
    const float inv = 1.0f / float(std::max(std::sqrt(norm), 1e-12));
    for (int64_t j = 0; j < d; ++j) unit_by_dim[size_t(j * n + i)] = double(row[j] * inv);
  }
  for (int c = 0; c < k; ++c) {
    const int64_t seed = c * n / k;
    std::memcpy(&centroids[c * d], &points[seed * d], size_t(d) * 4);
  }
  std::vector<double> unit_centroid(static_cast<size_t>(d));   // [d] one centroid's
  std::vector<double> similarity(static_cast<size_t>(k * n));  // [k, n]
  std::vector<double> sums(static_cast<size_t>(k * d));        // [k, d]
  std::vector<int64_t> counts(static_cast<size_t>(k));
  std::fill(labels, labels + n, 0);  // without iterations every point is in cluster 0
  for (int iteration = 0; iteration < iterations; ++iteration) {
    for (int c = 0; c < k; ++c) {
      const float* centroid = &centroids[c * d];
      double norm = 0;
      for (int64_t j = 0; j < d; ++j) norm += double(centroid[j]) * centroid[j];
      const float inv = 1.0f / float(std::max(std::sqrt(norm), 1e-12));
      for (int64_t j = 0; j < d; ++j) unit_centroid[size_t(j)] = double(centroid[j] * inv);
      DimensionMajorDots(unit_by_dim.data(), n, d, unit_centroid.data(),
                         &similarity[size_t(c * n)]);
    }
    for (int64_t i = 0; i < n; ++i) {
      int best = 0;
      double best_similarity = -std::numeric_limits<double>::infinity();
      for (int c = 0; c < k; ++c) {
        if (similarity[size_t(c * n + i)] > best_similarity) {
          best_similarity = similarity[size_t(c * n + i)];
          best = c;
        }
      }
      labels[i] = best;
    }
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int c = labels[i];
      counts[size_t(c)]++;
      for (int64_t j = 0; j < d; ++j) sums[size_t(c * d + j)] += points[i * d + j];
    }
    for (int c = 0; c < k; ++c) {
      if (counts[size_t(c)] == 0) continue;  // an empty cluster keeps its centroid
      for (int64_t j = 0; j < d; ++j) {
        centroids[c * d + j] = float(sums[size_t(c * d + j)] / (double(counts[size_t(c)]) + 1e-6));
      }
    }
  }
}

void ShiftCentroids(const float* now, std::span<const int> now_rows, const float* before,
                    std::span<const int> labels, std::span<const float> members, int64_t width,
                    float* centroids) {
  PS_CHECK(now_rows.size() == labels.size());
  const int64_t k = int64_t(members.size());
  std::vector<double> shift(size_t(k * width), 0.0);  // [K, width]
  std::vector<bool> moved(size_t(k), false);
  for (size_t i = 0; i < labels.size(); ++i) {
    const int label = labels[i];
    PS_CHECK(label >= 0 && label < k);
    const float* new_row = now + int64_t(now_rows[i]) * width;
    const float* old_row = before + int64_t(i) * width;
    for (int64_t j = 0; j < width; ++j)
      shift[size_t(label * width + j)] += double(new_row[j]) - old_row[j];
    moved[size_t(label)] = true;
  }
  for (int64_t c = 0; c < k; ++c) {
    if (!moved[size_t(c)] || members[size_t(c)] <= 0) continue;
    for (int64_t j = 0; j < width; ++j) {
      centroids[c * width + j] += float(shift[size_t(c * width + j)] / (members[size_t(c)] + 1e-6));
    }
  }
}

bool PassesDriftGate(double confidence, double delta, double floor, double tau_s, double alpha,
                     double cap) {
  if (!(confidence > floor && confidence < tau_s)) return false;
  const double gate = alpha * (tau_s - confidence) * (tau_s - confidence);
  return delta >= gate && delta < cap;
}

namespace {

constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

float E2M1ToFloat(uint8_t code) {
  const float magnitude = kE2M1Magnitudes[code & 7];
  return (code & 8) ? -magnitude : magnitude;
}

uint8_t FloatToE2M1(float value) {
  const uint8_t sign = std::signbit(value) ? 8 : 0;
  const float magnitude = std::min(std::fabs(value), 6.0f);
  uint8_t best = 0;
  float best_error = INFINITY;
  for (uint8_t code = 0; code < 8; ++code) {
    const float error = std::fabs(kE2M1Magnitudes[code] - magnitude);
    // Nearest; on a tie the even code wins (round half to even on the E2M1 grid).
    if (error < best_error || (error == best_error && code % 2 == 0)) {
      best = code;
      best_error = error;
    }
  }
  return best == 0 ? 0 : uint8_t(sign | best);
}

float E4M3ToFloat(uint8_t code) {
  const int sign = (code & 0x80) ? -1 : 1;
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(float(mantissa) / 8.0f, -6);
  return sign * std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
}

uint8_t FloatToE4M3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float magnitude = std::min(std::fabs(value), 448.0f);
  uint8_t best = 0;
  float best_error = INFINITY;
  for (uint8_t code = 0; code < 0x7f; ++code) {  // every finite non-negative code
    const float error = std::fabs(E4M3ToFloat(code) - magnitude);
    if (error < best_error || (error == best_error && code % 2 == 0)) {
      best = code;
      best_error = error;
    }
  }
  return best == 0 ? 0 : uint8_t(sign | best);
}

float Nvfp4TensorScale(float amax) { return amax > 0 ? amax / (6.0f * 448.0f) : 1.0f; }

void QuantizeNvfp4(const float* x, int64_t n, float tensor_scale, uint8_t* scales,
                   uint8_t* values) {
  const int64_t blocks = Nvfp4ScaleBytes(n);
  std::fill(values, values + Nvfp4ValueBytes(n), uint8_t(0));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * 16, end = std::min(n, begin + 16);
    float block_max = 0;
    for (int64_t i = begin; i < end; ++i) block_max = std::max(block_max, std::fabs(x[i]));
    const uint8_t scale_code = FloatToE4M3(block_max / 6.0f / tensor_scale);
    scales[b] = scale_code;
    const float scale = E4M3ToFloat(scale_code) * tensor_scale;
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t code = scale > 0 ? FloatToE2M1(x[i] / scale) : 0;
      values[i / 2] |= uint8_t(code << (4 * (i % 2)));
    }
  }
}

void DequantizeNvfp4(const uint8_t* scales, const uint8_t* values, int64_t n, float tensor_scale,
                     float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float scale = E4M3ToFloat(scales[i / 16]) * tensor_scale;
    const uint8_t code = (values[i / 2] >> (4 * (i % 2))) & 0xf;
    out[i] = E2M1ToFloat(code) * scale;
  }
}

}  // namespace polestar

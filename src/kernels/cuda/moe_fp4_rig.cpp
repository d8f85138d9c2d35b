#include "kernels/cuda/moe_fp4_rig.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/dtype.h"
#include "kernels/cuda/kernel_timer.h"

namespace fathom::cuda {

namespace {

float e4m3_value(uint8_t b) {
  const int E = (b >> 3) & 0xF, M = b & 7;
  const float v = E == 0 ? std::ldexp(float(M) / 8.f, -6) : std::ldexp(1.f + float(M) / 8.f, E - 7);
  return (b & 0x80) ? -v : v;
}

float e2m1_value(int code) {
  static const float lut[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -lut[code & 7] : lut[code & 7];
}

}  // namespace

MoeFp4Rig::HostMatrix MoeFp4Rig::random_fp4(int rows, int k, bool keep_values) {
  HostMatrix m;
  m.rows = rows;
  m.k = k;
  m.codes.resize(size_t(rows) * k / 2);
  m.scales.resize(size_t(rows) * k / 16);
  // Fast bytes for the codes (a 64-bit generator per 8 codes); the scales from the rig's engine.
  uint64_t state = rng_() | (uint64_t(rng_()) << 32) | 1;
  for (size_t i = 0; i < m.codes.size(); i += 8) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    for (size_t j = 0; j < 8 && i + j < m.codes.size(); ++j) m.codes[i + j] = uint8_t(state >> (8 * j));
  }
  // Mostly normal scales around 1, some e4m3 subnormals, a few zeros and the largest value.
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 99);
  for (auto& s : m.scales) {
    const int r = pick(rng_);
    s = r < 4 ? 0 : r < 12 ? uint8_t(1 + byte(rng_) % 7) : r < 14 ? 0x7e : uint8_t(0x30 + byte(rng_) % 16);
  }
  if (keep_values) {
    m.w.resize(size_t(rows) * k);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < k; ++i) {
        const int code = (m.codes[(size_t(r) * k + i) / 2] >> ((i & 1) * 4)) & 0xF;
        m.w[size_t(r) * k + i] = e2m1_value(code) * e4m3_value(m.scales[size_t(r) * (k / 16) + i / 16]) * m.global;
      }
  }
  return m;
}

// Random E4M3 codes (every value but NaN) and 128 x 128 block scales spread over two decades,
// as Qwen's FP8 releases store them.
MoeFp4Rig::HostMatrix MoeFp4Rig::random_fp8(int rows, int k, bool keep_values) {
  HostMatrix m;
  m.rows = rows;
  m.k = k;
  m.codes.resize(size_t(rows) * k);
  uint64_t state = rng_() | (uint64_t(rng_()) << 32) | 1;
  for (size_t i = 0; i < m.codes.size(); i += 8) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    for (size_t j = 0; j < 8 && i + j < m.codes.size(); ++j) {
      const uint8_t b = uint8_t(state >> (8 * j));
      m.codes[i + j] = (b & 0x7F) == 0x7F ? uint8_t(b - 1) : b;
    }
  }
  const int br = (rows + 127) / 128, bc = (k + 127) / 128;
  std::uniform_real_distribution<float> exponent(-9.f, -5.f);
  m.block_scales.resize(size_t(br) * bc);
  for (float& s : m.block_scales) s = std::exp2(exponent(rng_));
  if (keep_values) {
    m.w.resize(size_t(rows) * k);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < k; ++i)
        m.w[size_t(r) * k + i] = e4m3_value(m.codes[size_t(r) * k + i]) * m.block_scales[size_t(r / 128) * bc + i / 128];
  }
  return m;
}

MoeFp4Rig::DeviceMatrix MoeFp4Rig::pack(const HostMatrix& m, PackedFormat format) {
  DeviceMatrix d;
  auto src_codes = DeviceBuffer::from_host(m.codes);
  if (format == PackedFormat::Fp8) {
    // The slab scales: the block scale over each 16-row x 64-k slab.
    const int row_tiles = (m.rows + kPackedTileRows - 1) / kPackedTileRows;
    const int k_slabs = (m.k + kPackedSlabK - 1) / kPackedSlabK, bc = (m.k + 127) / 128;
    std::vector<float> slab(size_t(row_tiles) * k_slabs);
    for (int rt = 0; rt < row_tiles; ++rt)
      for (int ks = 0; ks < k_slabs; ++ks)
        slab[size_t(rt) * k_slabs + ks] = m.block_scales[size_t(rt * kPackedTileRows / 128) * bc + ks * kPackedSlabK / 128];
    d.scales = DeviceBuffer::from_host(slab);
    d.codes = DeviceBuffer(size_t(packed_fp8_code_bytes(m.rows, m.k)));
    d.desc = pack_fp8(src_codes.as<uint8_t>(), d.scales.as<float>(), m.rows, m.k, d.codes.as<uint8_t>(), nullptr);
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    return d;
  }
  auto src_scales = DeviceBuffer::from_host(m.scales);
  d.codes = DeviceBuffer(size_t(packed_fp4_code_bytes(m.rows, m.k)));
  d.scales = DeviceBuffer(size_t(packed_fp4_scale_bytes(m.rows, m.k)));
  d.desc = pack_fp4(src_codes.as<uint8_t>(), src_scales.as<uint8_t>(), m.global, m.rows, m.k, d.codes.as<uint8_t>(),
                    d.scales.as<uint16_t>(), nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

MoeFp4Rig::MoeFp4Rig(const MoeFp4Shape& shape, int max_tokens, uint32_t seed, bool reference, PackedFormat format)
    : shape_(shape), max_T_(max_tokens), rng_(seed), has_reference_(reference) {
  const MoeFp4Shape& c = shape_;
  std::vector<PackedMatrix> g, u, d;
  auto random = [&](int rows, int k) {
    return format == PackedFormat::Fp8 ? random_fp8(rows, k, reference) : random_fp4(rows, k, reference);
  };
  for (int e = 0; e < c.E; ++e) {
    std::array<HostMatrix, 3> m = {random(c.I, c.H), random(c.I, c.H), random(c.H, c.I)};
    for (int j = 0; j < 3; ++j) dev_.push_back(pack(m[size_t(j)], format));
    g.push_back(dev_[dev_.size() - 3].desc);
    u.push_back(dev_[dev_.size() - 2].desc);
    d.push_back(dev_[dev_.size() - 1].desc);
    if (reference) host_.push_back(std::move(m));
  }
  tables_[0] = DeviceBuffer::from_host(g);
  tables_[1] = DeviceBuffer::from_host(u);
  tables_[2] = DeviceBuffer::from_host(d);
  ex_.num = c.E;
  ex_.inter = c.I;
  ex_.hidden = c.H;
  ex_.gate = tables_[0].as<PackedMatrix>();
  ex_.up = tables_[1].as<PackedMatrix>();
  ex_.down = tables_[2].as<PackedMatrix>();
  ex_.format = format;
  // Inputs for max_T tokens: bf16 activations, distinct experts per token, positive weights.
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> uw(0.05f, 1.f);
  x_.resize(size_t(max_T_) * c.H);
  for (auto& v : x_) v = ::fathom::f32_to_bf16(nd(rng_));
  ids_.resize(size_t(max_T_) * c.K);
  w_.resize(ids_.size());
  std::vector<int> perm(size_t(c.E));
  for (int t = 0; t < max_T_; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    for (int k = 0; k < c.K; ++k) ids_[size_t(t) * c.K + k] = perm[size_t(k)], w_[size_t(t) * c.K + k] = uw(rng_);
  }
  const int P = max_T_ * c.K;
  group_buf_ = GuardedBuffer(size_t(moe_group_scratch_ints(P, c.E)) * 4);
  group_ = moe_group_scratch(group_buf_.as<int32_t>(), P, c.E);
  dx_ = GuardedBuffer::from_host(x_);
  dids_ = GuardedBuffer::from_host(ids_);
  dw_ = GuardedBuffer::from_host(w_);
  h_ = GuardedBuffer(size_t(P) * c.I * 2);
  pair_out_ = GuardedBuffer(size_t(P) * c.H * 4);
  y_ = GuardedBuffer(size_t(max_T_) * c.H * 4);
}

void MoeFp4Rig::launch(int T, cudaStream_t s, int first) {
  FATHOM_CHECK(T > 0 && first >= 0 && first + T <= max_T_, "MoeFp4Rig: tokens ", first, " + ", T, " of ", max_T_);
  const int64_t K = shape_.K;
  moe_experts_packed(ex_, dx_.as<bf16_t>() + int64_t(first) * shape_.H, dids_.as<int32_t>() + first * K,
                     dw_.as<float>() + first * K, h_.as<bf16_t>(), pair_out_.as<float>(), y_.as<float>(), T, shape_.K,
                     nullptr, nullptr, 1, group_, s, plan);
}

std::vector<float> MoeFp4Rig::output(int T) const {
  std::vector<float> y(size_t(T) * shape_.H);
  FATHOM_CUDA_CHECK(cudaMemcpy(y.data(), y_.data(), y.size() * 4, cudaMemcpyDeviceToHost));
  return y;
}

double MoeFp4Rig::time_ms(int T, int reps) {
  if (T > kMoeFp4SmallT || 2 * T > max_T_) return median_launch_ms([&] { launch(T); }, reps);
  const int windows = max_T_ / T, steps = std::min(windows, 16);
  return median_graph_launch_ms([&](int j, cudaStream_t s) { launch(T, s, (j % windows) * T); }, steps, reps);
}

const std::vector<double>& MoeFp4Rig::reference(int t) {
  FATHOM_CHECK(has_reference_, "MoeFp4Rig: built without the host reference");
  auto it = ref_cache_.find(t);
  if (it == ref_cache_.end()) it = ref_cache_.emplace(t, compute_reference(t)).first;
  return it->second;
}

std::vector<double> MoeFp4Rig::compute_reference(int t) const {
  const MoeFp4Shape& c = shape_;
  std::vector<double> y(size_t(c.H), 0.0), h(size_t(c.I)), x(size_t(c.H));
  for (int j = 0; j < c.H; ++j) x[size_t(j)] = ::fathom::bf16_to_f32(x_[size_t(t) * c.H + j]);
  for (int k = 0; k < c.K; ++k) {
    const auto& m = host_[size_t(ids_[size_t(t) * c.K + k])];
    for (int i = 0; i < c.I; ++i) {
      double g = 0, u = 0;
      for (int j = 0; j < c.H; ++j) {
        g += m[0].w[size_t(i) * c.H + j] * x[size_t(j)];
        u += m[1].w[size_t(i) * c.H + j] * x[size_t(j)];
      }
      h[size_t(i)] = ::fathom::bf16_to_f32(::fathom::f32_to_bf16(float(g / (1.0 + std::exp(-g)) * u)));
    }
    for (int n = 0; n < c.H; ++n) {
      double acc = 0;
      for (int i = 0; i < c.I; ++i) acc += m[2].w[size_t(n) * c.I + i] * h[size_t(i)];
      y[size_t(n)] += w_[size_t(t) * c.K + k] * acc;
    }
  }
  return y;
}

double moe_row_error(const float* got, const std::vector<double>& ref) {
  double worst = 0, scale = 1e-30;
  for (size_t n = 0; n < ref.size(); ++n) {
    worst = std::max(worst, std::fabs(double(got[n]) - ref[n]));
    scale = std::max(scale, std::fabs(ref[n]));
  }
  return worst / scale;
}

}  // namespace fathom::cuda

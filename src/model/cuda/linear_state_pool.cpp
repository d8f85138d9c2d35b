#include "model/cuda/linear_state_pool.h"

#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

void LinearStatePool::allocate(const ModelConfig& cfg, int layers, int slots, int snapshot_slots) {
  layers_ = layers;
  slots_ = slots;
  snapshot_slots_ = snapshot_slots;
  conv_ = cfg.linear_conv_state_values();
  rec_ = cfg.linear_recurrent_state_values();
  if (layers == 0) return;
  conv_state_ = DeviceBuffer(size_t(layers) * slots * conv_ * 4);
  rec_state_ = DeviceBuffer(size_t(layers) * slots * rec_ * 4);
  if (snapshot_slots > 0) {  // prefix snapshots' states, apart from the slots
    snap_conv_ = DeviceBuffer(size_t(layers) * snapshot_slots * conv_ * 4);
    snap_rec_ = DeviceBuffer(size_t(layers) * snapshot_slots * rec_ * 4);
  }
}

void LinearStatePool::zero(int slot, cudaStream_t s) {
  for (int l = 0; l < layers_; ++l) {
    FATHOM_CUDA_CHECK(cudaMemsetAsync(conv(l) + int64_t(slot) * conv_, 0, size_t(conv_) * 4, s));
    FATHOM_CUDA_CHECK(cudaMemsetAsync(rec(l) + int64_t(slot) * rec_, 0, size_t(rec_) * 4, s));
  }
}

void LinearStatePool::ensure_history(int entries) {
  if (hist_.conv || layers_ == 0) return;
  conv_hist_ = DeviceBuffer(size_t(layers_) * slots_ * entries * conv_ * 4);
  rec_hist_ = DeviceBuffer(size_t(layers_) * slots_ * entries * rec_ * 4);
  hist_.conv = conv_hist_.as<float>();
  hist_.recurrent = rec_hist_.as<float>();
  hist_.entries = entries;
}

// [layer][slot][entry][values]
StateHistory LinearStatePool::layer_history(int layer, const int32_t* keep) const {
  const int64_t per_layer = int64_t(slots_) * hist_.entries;
  StateHistory h = hist_;
  h.conv += layer * per_layer * conv_;
  h.recurrent += layer * per_layer * rec_;
  h.keep = keep;
  return h;
}

void LinearStatePool::restore(int slot, int entry, cudaStream_t s) {
  restore_linear_state(conv_state_.as<float>(), rec_state_.as<float>(), hist_, layers_, slots_, slot, entry, conv_, rec_,
                       s);
}

void LinearStatePool::save_snapshot(int slot, int snap_slot, cudaStream_t s) {
  copy(conv_state_, slots_, slot, snap_conv_, snapshot_slots_, snap_slot, conv_, s);
  copy(rec_state_, slots_, slot, snap_rec_, snapshot_slots_, snap_slot, rec_, s);
}

void LinearStatePool::load_snapshot(int snap_slot, int slot, cudaStream_t s) {
  copy(snap_conv_, snapshot_slots_, snap_slot, conv_state_, slots_, slot, conv_, s);
  copy(snap_rec_, snapshot_slots_, snap_slot, rec_state_, slots_, slot, rec_, s);
}

void LinearStatePool::snapshot_to_host(int snap_slot, float* host, cudaStream_t s) const {
  if (layers_ == 0) return;
  const size_t c = size_t(conv_) * 4, r = size_t(rec_) * 4;
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(host, c, snap_conv_.as<char>() + snap_slot * c, snapshot_slots_ * c, c,
                                      size_t(layers_), cudaMemcpyDeviceToHost, s));
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(host + int64_t(layers_) * conv_, r, snap_rec_.as<char>() + snap_slot * r,
                                      snapshot_slots_ * r, r, size_t(layers_), cudaMemcpyDeviceToHost, s));
}

void LinearStatePool::snapshot_from_host(const float* host, int snap_slot, cudaStream_t s) const {
  if (layers_ == 0) return;
  const size_t c = size_t(conv_) * 4, r = size_t(rec_) * 4;
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(snap_conv_.as<char>() + snap_slot * c, snapshot_slots_ * c, host, c, c,
                                      size_t(layers_), cudaMemcpyHostToDevice, s));
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(snap_rec_.as<char>() + snap_slot * r, snapshot_slots_ * r,
                                      host + int64_t(layers_) * conv_, r, r, size_t(layers_), cudaMemcpyHostToDevice,
                                      s));
}

// One row a layer: the pitch is the layer's slots.
void LinearStatePool::copy(const DeviceBuffer& from, int from_slots, int from_slot, const DeviceBuffer& to,
                           int to_slots, int to_slot, int64_t per_slot, cudaStream_t s) const {
  if (layers_ == 0) return;
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(to.as<float>() + int64_t(to_slot) * per_slot, size_t(to_slots) * per_slot * 4,
                                      from.as<float>() + int64_t(from_slot) * per_slot,
                                      size_t(from_slots) * per_slot * 4, size_t(per_slot) * 4, size_t(layers_),
                                      cudaMemcpyDeviceToDevice, s));
}

}  // namespace fathom::cuda

// The Gated DeltaNet state of the CUDA engine, [layer][slot][values] for every linear-attention
// layer: each sequence slot's convolution window and recurrent state (slot `pad_slot` serves the
// rows that pad decode batches), the per-step history a draft verification keeps so a rollback
// can restore an earlier length (made on first use), and the prefix snapshots' copies. Which
// slot a sequence holds is the runner's business; this is the memory and its copies.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

class LinearStatePool {
 public:
  // `slots` sequence slots (the padding slot included) and `snapshot_slots` snapshot copies for
  // `layers` linear-attention layers of `cfg` (this rank's heads). Nothing when layers == 0.
  void allocate(const ModelConfig& cfg, int layers, int slots, int snapshot_slots);

  int layers() const { return layers_; }
  int slots() const { return slots_; }
  // One slot's state in one layer, in floats.
  int64_t conv_values() const { return conv_; }
  int64_t rec_values() const { return rec_; }
  int64_t bytes() const { return int64_t(conv_state_.bytes() + rec_state_.bytes() + snap_conv_.bytes() + snap_rec_.bytes()); }
  // Bytes the history takes for `entries` states a slot (what the KV budget reserves).
  int64_t history_bytes(int entries) const { return int64_t(layers_) * slots_ * entries * (conv_ + rec_) * 4; }

  // Layer `layer`'s states of every slot (what the DeltaNet kernels index by slot).
  float* conv(int layer) const { return conv_state_.as<float>() + int64_t(layer) * slots_ * conv_; }
  float* rec(int layer) const { return rec_state_.as<float>() + int64_t(layer) * slots_ * rec_; }

  // A new sequence starts from zero state.
  void zero(int slot, cudaStream_t s);

  // The history of `entries` states a slot, made on first use.
  void ensure_history(int entries);
  bool has_history() const { return hist_.conv != nullptr; }
  // Layer `layer`'s view of the history; `keep` marks the steps that record it.
  StateHistory layer_history(int layer, const int32_t* keep) const;
  // Slot `slot`'s state after `entry` tokens of its last recorded step back in place (rollback).
  void restore(int slot, int entry, cudaStream_t s);

  // Slot `slot`'s state into snapshot slot `snap_slot`, or back.
  void save_snapshot(int slot, int snap_slot, cudaStream_t s);
  void load_snapshot(int snap_slot, int slot, cudaStream_t s);
  // Snapshot slot `snap_slot`'s state to `host` ([conv: layer][rec: layer], host_bytes() bytes,
  // pinned), or back, queued on `s` (the host tier's copies).
  int64_t host_bytes() const { return int64_t(layers_) * (conv_ + rec_) * 4; }
  void snapshot_to_host(int snap_slot, float* host, cudaStream_t s) const;
  void snapshot_from_host(const float* host, int snap_slot, cudaStream_t s) const;

 private:
  void copy(const DeviceBuffer& from, int from_slots, int from_slot, const DeviceBuffer& to, int to_slots, int to_slot,
            int64_t per_slot, cudaStream_t s) const;

  int layers_ = 0, slots_ = 0, snapshot_slots_ = 0;
  int64_t conv_ = 0, rec_ = 0;
  DeviceBuffer conv_state_, rec_state_, snap_conv_, snap_rec_, conv_hist_, rec_hist_;
  StateHistory hist_;
};

}  // namespace fathom::cuda

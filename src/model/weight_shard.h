// Cuts full-size weights down to one rank's slice (model/tensor_split.h says which). The loader
// applies it one layer at a time as it reads the checkpoint, so a rank never holds more than one
// full layer beside its own slice.
#pragma once
#include <vector>

#include "model/model_weights.h"
#include "model/tensor_split.h"

namespace fathom {

// Rows `ranges` (in order) of a row-major matrix of rows of `width` values.
std::vector<float> rows_of(const std::vector<float>& m, int64_t width, const std::vector<IndexRange>& ranges);
// The output rows of `w` in `ranges`, in order (y = x W^T keeps those outputs).
LinearWeight take_rows(const LinearWeight& w, const std::vector<IndexRange>& ranges);
// The input columns of `w` in `cols` (a row-parallel slice: its outputs are partial sums).
LinearWeight take_columns(const LinearWeight& w, IndexRange cols);

// One decoder layer (or the MTP layer's) cut to `split`.
LayerWeights shard_layer(LayerWeights layer, const ModelConfig& cfg, const TensorSplit& split);
// Embedding and lm_head rows of split.vocab, zero-padded to split.vocab_rows.
void shard_vocabulary(ModelWeights& w, const ModelConfig& cfg, const TensorSplit& split);

}  // namespace fathom

#include "model/cuda/step_plan.h"

namespace fathom::cuda {

OutputLayout output_layout(std::span<const ForwardStep> steps) {
  OutputLayout o;
  for (const ForwardStep& st : steps) {
    o.row_begin.push_back(o.rows);
    o.rows += st.all_rows ? int64_t(st.tokens.size()) : 1;
    o.hidden_row_begin.push_back(o.hidden_rows);
    o.hidden_rows += st.all_rows || st.all_hidden ? int64_t(st.tokens.size()) : 1;
  }
  return o;
}

std::vector<RowCopy> hidden_copies(std::span<const ForwardStep> steps, const std::vector<Piece>& pieces,
                                   const StepPlan& p, const std::vector<int64_t>& hidden_row_begin) {
  std::vector<RowCopy> out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& pc = pieces[i];
    const ForwardStep& st = steps[pc.step];
    if (st.all_rows || st.all_hidden) out.push_back({p.row_begin[i], hidden_row_begin[pc.step] + pc.offset, pc.n});
    else if (pc.last) out.push_back({p.row_begin[i], hidden_row_begin[pc.step], 1});
  }
  return out;
}

std::vector<int> graph_buckets(int max_seqs) {
  std::vector<int> b;
  for (int s : {1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256})
    if (s < max_seqs) b.push_back(s);
  for (int s = 320; s < max_seqs; s += 64) b.push_back(s);
  b.push_back(max_seqs);
  return b;
}

int graph_bucket(int max_seqs, int S) {
  for (int b : graph_buckets(max_seqs))
    if (b >= S) return b;
  return S;
}

}  // namespace fathom::cuda

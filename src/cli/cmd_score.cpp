// `fathom score MODEL --token-ids 1,2,3 --logits-out out.npy`: teacher-forced logits.
#include <cstdio>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "io/npy.h"
#include "model/hybrid_model.h"
#include "runtime/generate.h"

namespace fathom::cli {
namespace {

struct ScoreArgs {
  std::string model, token_ids, logits_out, device = "cpu";
  int chunk = 512;
};

void run_score(const ScoreArgs& a) {
  require_supported_device(a.device);
  std::vector<int32_t> ids = parse_token_ids(a.token_ids);
  auto model = HybridModel::load(a.model, /*with_mtp=*/false);
  SequenceState state = model->new_sequence();
  HybridModel::Output out = prefill(*model, state, ids, a.chunk, /*all_rows=*/true);
  write_npy_f32(a.logits_out, out.logits.data(), {out.rows, model->config().vocab_size});
  std::printf("wrote logits [%lld, %d] to %s\n", static_cast<long long>(out.rows), model->config().vocab_size,
              a.logits_out.c_str());
}

CommandRegistrar reg([](CLI::App& app) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* sub = app.add_subcommand("score", "Teacher-forced logits of a token sequence, saved as .npy");
  sub->add_option("model", args->model, "Checkpoint folder")->required();
  sub->add_option("--token-ids", args->token_ids, "Comma-separated token ids")->required();
  sub->add_option("--logits-out", args->logits_out, "Output .npy (float32 [T, vocab]; row t predicts token t+1)")
      ->required();
  sub->add_option("--device", args->device, "cpu or cuda");
  sub->add_option("--prefill-chunk", args->chunk, "Tokens per forward pass");
  sub->callback([args] { run_score(*args); });
});

}  // namespace
}  // namespace fathom::cli

// `fathom score MODEL --token-ids 1,2,3 --logits-out out.npy`: teacher-forced logits; with
// --mtp-logits-out, the MTP layer's too (its draft distribution at every position: what a
// sampled draft would be drawn from).
#include <algorithm>
#include <cstdio>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "core/error.h"
#include "io/npy.h"
#include "model/model_runner.h"

namespace fathom::cli {
namespace {

struct ScoreArgs {
  std::string model, token_ids, logits_out, mtp_logits_out, device = "auto";
  int chunk = 512;
  TensorParallelism parallel;
};

void run_score(const ScoreArgs& a) {
  std::vector<int32_t> ids = parse_token_ids(a.token_ids);
  FATHOM_CHECK(!ids.empty(), "--token-ids is empty");
  FATHOM_CHECK(a.chunk > 0, "--prefill-chunk must be positive");
  EngineOptions eo;
  eo.parallel = a.parallel;
  const bool mtp = !a.mtp_logits_out.empty();
  auto runner = open_model(a.model, a.device, /*with_mtp=*/mtp, eo);
  FATHOM_CHECK(!mtp || runner->has_mtp(), "--mtp-logits-out: ", a.model, " has no MTP layer");
  const int64_t V = runner->config().vocab_size, H = runner->config().hidden_size;
  SequenceId seq = runner->add_sequence();
  std::vector<float> logits, hidden;
  for (size_t begin = 0; begin < ids.size(); begin += size_t(a.chunk)) {
    const size_t end = std::min(ids.size(), begin + size_t(a.chunk));
    ForwardStep step{seq, std::span<const int32_t>(ids.data() + begin, end - begin), /*all_rows=*/true};
    step.all_hidden = mtp;
    ForwardOutput out = runner->forward(std::span<const ForwardStep>(&step, 1));
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
    if (mtp) hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());  // the MTP layer's input
  }
  if (mtp && ids.size() > 1) {
    // MTP row t: the hidden state at t and token t + 1 in, a distribution over token t + 2 out
    // (the main model's row t + 1 predicts the same token).
    FATHOM_CHECK(int64_t(hidden.size()) == int64_t(ids.size()) * H, "--mtp-logits-out: hidden rows missing");
    std::vector<float> mtp_logits;
    for (size_t begin = 0; begin + 1 < ids.size(); begin += size_t(a.chunk)) {
      const size_t end = std::min(ids.size() - 1, begin + size_t(a.chunk));
      MtpStep step{seq, std::span<const float>(hidden.data() + begin * H, (end - begin) * H),
                   std::span<const int32_t>(ids.data() + begin + 1, end - begin)};
      ForwardOutput out = runner->mtp_forward(std::span<const MtpStep>(&step, 1));
      mtp_logits.insert(mtp_logits.end(), out.logits.begin(), out.logits.end());
    }
    write_npy_f32(a.mtp_logits_out, mtp_logits.data(), {int64_t(mtp_logits.size()) / V, V});
    std::printf("wrote MTP logits [%lld, %lld] to %s\n", static_cast<long long>(mtp_logits.size() / V),
                static_cast<long long>(V), a.mtp_logits_out.c_str());
  }
  runner->remove_sequence(seq);
  const int64_t rows = int64_t(logits.size()) / V;
  write_npy_f32(a.logits_out, logits.data(), {rows, V});
  std::printf("wrote logits [%lld, %lld] to %s (%s)\n", static_cast<long long>(rows), static_cast<long long>(V),
              a.logits_out.c_str(), runner->device_name().c_str());
}

CommandRegistrar reg([](CLI::App& app) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* sub = app.add_subcommand("score", "Teacher-forced logits of a token sequence, saved as .npy");
  sub->add_option("model", args->model, "Checkpoint folder")->required();
  sub->add_option("--token-ids", args->token_ids, "Comma-separated token ids")->required();
  sub->add_option("--logits-out", args->logits_out, "Output .npy (float32 [T, vocab]; row t predicts token t+1)")
      ->required();
  sub->add_option("--mtp-logits-out", args->mtp_logits_out,
                  "Also the MTP layer's logits (.npy float32 [T - 1, vocab]; row t predicts token t+2)");
  sub->add_option("--device", args->device, "auto (cuda when a GPU is visible), cpu or cuda")->capture_default_str();
  sub->add_option("--prefill-chunk", args->chunk, "Tokens per forward pass");
  add_parallel_options(sub, args->parallel);
  sub->callback([args] { run_score(*args); });
});

}  // namespace
}  // namespace fathom::cli

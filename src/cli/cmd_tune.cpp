// `fathom tune MODEL [--backend-policy verified-fastest|fixed] [--moe-runner-backend C]
// [--no-cache] [--json-out F]`: verifies every candidate kernel of the model's heavy ops on this
// GPU (each in a child process, against a reference), times the ones that pass per shape bucket,
// prints every check and the choice per bucket, and caches them under $XDG_CACHE_HOME/fathom
// (model/cuda/backend_tuning.h). `serve` and `bench` do the same on start, from the cache when
// it has this GPU, driver, CUDA runtime and model. MODEL: a checkpoint folder or a config.json.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "core/error.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#ifdef FATHOM_HAVE_CUDA
#include "model/cuda/backend_tuning.h"
#endif

namespace fathom::cli {

void run_tune(const TuneArgs& a) {
#ifdef FATHOM_HAVE_CUDA
  namespace fs = std::filesystem;
  const fs::path config_path = fs::is_directory(a.model) ? fs::path(a.model) / "config.json" : fs::path(a.model);
  const std::string text = read_text_file(config_path);
  const ModelConfig cfg = ModelConfig::parse(text, "", config_path.string());
  // A bare config.json stands for the NVFP4 release (as `bench` builds its dummy weights).
  const QuantConfig quant = fs::is_directory(a.model) ? QuantConfig::load(a.model, text) : QuantConfig{};
  const bool nvfp4 = cfg.num_experts > 0 && !a.bf16_experts && (!fs::is_directory(a.model) || quant.declares_nvfp4());
  const BackendOptions& b = a.backends;
  const cuda::TuneResult r = cuda::tune_backends(cfg, nvfp4, cuda::tune_options(b), quant.declares_fp8());
  for (const std::string& line : cuda::describe_backends(r)) std::printf("%s\n", line.c_str());
  nlohmann::json j = {{"gpu", r.gpu}, {"tuned", r.tuned}, {"note", r.note}, {"from_cache", r.from_cache},
                      {"seconds", r.seconds}, {"cache_file", r.cache_file}};
  if (r.tuned) {
    std::printf("\n%-32s %7s  %-6s %10s %10s  %s\n", "op/candidate", "size", "passed", "max error", "ms", "failed check");
    for (const BackendCheck& c : r.checks) {
      std::printf("%-32s %7d  %-6s %10.2e %10.4f  %s\n", c.candidate.c_str(), c.bucket, c.passed ? "yes" : "no",
                  c.max_error, c.ms, c.failure.c_str());
      j["checks"].push_back({{"candidate", c.candidate}, {"bucket", c.bucket}, {"passed", c.passed},
                             {"max_error", c.max_error}, {"bound", c.bound}, {"ms", c.ms},
                             {"fingerprint", c.fingerprint}, {"failure", c.failure}});
    }
    for (const BackendChoice& c : r.choices)
      j["choices"].push_back({{"op", c.op}, {"bucket", c.bucket}, {"candidate", c.candidate}, {"why", c.why}});
  }
  if (!a.json_out.empty()) std::ofstream(a.json_out) << j.dump(2) << "\n";
#else
  (void)a;
  fail("fathom tune: this build has no CUDA engine (nvcc was not found at configure time)");
#endif
}

namespace {

CommandRegistrar reg([](CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  auto* sub = app.add_subcommand("tune", "Verify and time the kernel backends on this GPU for MODEL; cache the choice");
  sub->add_option("model", args->model, "Checkpoint folder or config.json (configs/*.json)")->required();
  add_backend_options(sub, args->backends);
  sub->add_flag("!--no-cache", args->backends.cache, "Verify and time again, then replace the cache entry");
  sub->add_flag("--bf16-experts", args->bf16_experts, "A config.json's experts as BF16 (no NVFP4 kernels to tune)");
  sub->add_option("--json-out", args->json_out, "Write the checks and choices as JSON");
  sub->callback([args] { run_tune(*args); });
});

}  // namespace
}  // namespace fathom::cli

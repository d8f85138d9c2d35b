// The tuning cache of `fathom tune` (issue 19): what was verified and chosen on one machine for
// one model, under $XDG_CACHE_HOME/fathom (else ~/.cache/fathom). An entry is keyed by every
// fact its results depend on (GPU name, compute capability, driver, CUDA runtime, Fathom
// version, the model's shapes): a changed driver or GPU finds no entry and tunes again.
#pragma once
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace fathom {

struct TuneKey {
  std::map<std::string, std::string> fields;
  // The file an entry with these fields lives in (a hash of the fields; the fields are stored
  // in it too, and compared on load).
  std::string file_name() const;
};

// $XDG_CACHE_HOME/fathom, or $HOME/.cache/fathom.
std::string tune_cache_dir();

// The entry's results, or nothing when there is none for exactly these fields (or it does not
// parse: a broken cache file is ignored, and overwritten by the next save).
std::optional<nlohmann::json> load_tune_cache(const TuneKey& key, const std::string& dir = tune_cache_dir());
// Writes atomically (a temporary file renamed over the entry).
void save_tune_cache(const TuneKey& key, const nlohmann::json& results, const std::string& dir = tune_cache_dir());

}  // namespace fathom

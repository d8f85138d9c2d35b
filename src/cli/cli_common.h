// Small helpers shared by the model-running subcommands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fathom::cli {

// Parses "1,2,3" into token ids; throws fathom::Error on anything else.
std::vector<int32_t> parse_token_ids(const std::string& text);

}  // namespace fathom::cli

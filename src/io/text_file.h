// Whole-file reads for small text files (configs, indexes, templates).
#pragma once
#include <filesystem>
#include <string>

namespace fathom {

// Returns the file's bytes; throws fathom::Error "PATH: cannot open" when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace fathom

#include "io/text_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fathom {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string(), ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace fathom

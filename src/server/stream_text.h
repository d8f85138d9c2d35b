// Small text helpers shared by the streaming output parsers (tool calls, reasoning): what a
// stream must hold back so that a delta never ends inside a tag or inside a UTF-8 sequence.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace fathom::server {

// Length of the longest suffix of `text` that is a proper prefix of `tag` (the start of a tag
// that more text may complete).
size_t partial_tag_suffix(std::string_view text, std::string_view tag);

// Length of a trailing UTF-8 lead byte and its continuation bytes when the sequence is not
// complete yet (0 when `text` ends on a character boundary, or on bytes that are invalid anyway).
size_t incomplete_utf8_tail(std::string_view text);

bool is_space(char c);  // the JSON / XML whitespace: space, tab, CR, LF

// Appends `raw` escaped for the inside of a JSON string. Byte by byte (bytes >= 0x80 pass
// through), so escaping pieces and joining them equals escaping the whole.
void append_json_escaped(std::string& out, std::string_view raw);

}  // namespace fathom::server

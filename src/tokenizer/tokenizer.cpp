#include "tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace fathom::tok {

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json_string(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(origin, ": invalid JSON: ", e.what());
  }
  Tokenizer t;
  try {
    auto get = [&](const char* key) -> const nlohmann::json& {
      static const nlohmann::json null_json;
      return j.contains(key) ? j[key] : null_json;
    };
    t.normalizer_ = make_normalizer(get("normalizer"));
    if (!j.contains("model")) fail("no 'model' in tokenizer.json");
    t.model_ = std::make_unique<BpeModel>(j["model"]);
    make_pre_tokenizers(get("pre_tokenizer"), t.pre_);
    if (!t.pre_.empty()) {
      if (auto* bl = dynamic_cast<ByteLevelPreTokenizer*>(t.pre_.back().get())) {
        bl->set_map_bytes(false);
        t.byte_input_ = true;
      }
    }
    t.post_ = make_post_processor(get("post_processor"));
    t.decoder_ = make_decoder(get("decoder"));
    t.added_.load(get("added_tokens"), t.normalizer_.get());
  } catch (const nlohmann::json::exception& e) {
    fail(origin, ": malformed tokenizer.json: ", e.what());
  } catch (const Error& e) {
    fail(origin, ": ", e.what());
  }
  return t;
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open tokenizer file ", path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_json_string(ss.str(), path.string());
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(dir)) return from_file(dir);
  if (!fs::is_directory(dir)) fail("tokenizer path ", dir.string(), " does not exist");
  for (const auto& cand : {dir / "tokenizer.json", dir / "tokenizer" / "tokenizer.json"})
    if (fs::is_regular_file(cand)) return from_file(cand);
  fail("no tokenizer.json in ", dir.string());
}

void Tokenizer::encode_text(std::string_view text, std::vector<uint32_t>& out) const {
  if (text.empty()) return;
  PieceArena arena;
  const size_t stages = pre_.size();
  std::vector<std::vector<std::string_view>> buf(stages);
  // Depth-first through the stages so only one piece per stage is live at a time.
  auto run = [&](auto&& self, size_t stage, std::string_view piece) -> void {
    if (stage == stages) {
      if (byte_input_) {
        model_->tokenize_bytes(piece, out);
      } else {
        model_->tokenize(piece, out);
      }
      return;
    }
    auto& b = buf[stage];
    size_t mark = b.size();
    pre_[stage]->split(piece, b, arena);
    for (size_t k = mark; k < b.size(); ++k) self(self, stage + 1, b[k]);
    b.resize(mark);
  };
  run(run, 0, text);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t valid = utf8_valid_prefix(text);
  if (valid != text.size()) fail("cannot tokenize: input is not valid UTF-8 (at byte ", valid, ")");
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 8);
  std::vector<Segment> segs;
  added_.split(text, false, segs);
  std::string norm;
  std::vector<Segment> sub;
  for (const auto& s : segs) {
    if (s.id >= 0) {
      out.push_back(static_cast<uint32_t>(s.id));
      continue;
    }
    std::string_view piece = text.substr(s.start, s.end - s.start);
    if (normalizer_) {
      norm.assign(piece);
      normalizer_->normalize(norm);
      piece = norm;
    }
    if (added_.has_normalized()) {
      sub.clear();
      added_.split(piece, true, sub);
      for (const auto& t : sub) {
        if (t.id >= 0) {
          out.push_back(static_cast<uint32_t>(t.id));
        } else {
          encode_text(piece.substr(t.start, t.end - t.start), out);
        }
      }
    } else {
      encode_text(piece, out);
    }
  }
  if (add_special_tokens && post_) post_->process(out);
  return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    if (const AddedToken* a = added_.by_id(id)) {
      if (skip_special_tokens && a->special) continue;
      tokens.push_back(a->content);
    } else if (const std::string* t = model_->id_to_token(id)) {
      // HF filters on the token's content being a special added token.
      if (skip_special_tokens) {
        auto aid = added_.token_to_id(*t);
        if (aid && added_.is_special(*aid)) continue;
      }
      tokens.push_back(*t);
    }
  }
  if (!decoder_) {
    std::string r;
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k) r += ' ';
      r += tokens[k];
    }
    return r;
  }
  decoder_->decode_chain(tokens);
  std::string r;
  for (auto& t : tokens) r += t;
  return r;
}

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.token_to_id(token)) return id;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(uint32_t id) const {
  if (const AddedToken* a = added_.by_id(id)) return a->content;
  if (const std::string* t = model_->id_to_token(id)) return *t;
  return std::nullopt;
}

size_t Tokenizer::vocab_size() const {
  size_t n = model_->vocab_size();
  for (const auto& a : added_.tokens()) n = std::max<size_t>(n, size_t(a.id) + 1);
  return n;
}

}  // namespace fathom::tok

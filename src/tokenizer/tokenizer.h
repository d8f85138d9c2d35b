// Hugging Face tokenizer.json tokenizer for byte-level BPE models (Qwen, Llama 3, DeepSeek),
// byte-exact with HF `tokenizers`:
//   added-token split -> normalizer -> pre-tokenizers -> BPE -> post-processor (encode)
//   ids -> tokens -> decoder (decode)
// Thread-safe: encode/decode may be called concurrently on one Tokenizer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_vocabulary.h"

namespace fathom::tok {

class BpeModel;
class Normalizer;
class PreTokenizer;
class PostProcessor;
class Decoder;

class Tokenizer {
 public:
  // Loads a tokenizer.json file. Throws fathom::Error (naming the file) on any problem,
  // including unsupported component types.
  static Tokenizer from_file(const std::filesystem::path& path);
  // Loads DIR/tokenizer.json from a model or tokenizer folder (PATH may also be the file itself).
  static Tokenizer from_dir(const std::filesystem::path& dir);
  // Parses tokenizer.json text (`origin` names it in errors).
  static Tokenizer from_json_string(const std::string& json, const std::string& origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Encodes UTF-8 text (throws fathom::Error on invalid UTF-8). add_special_tokens applies the
  // post-processor (e.g. a BOS token).
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Decodes ids (unknown ids are skipped, as in HF); invalid UTF-8 becomes U+FFFD.
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(uint32_t id) const;
  // Number of ids: max(model vocab, added tokens) + 1, like HF get_vocab_size(with_added_tokens=True).
  size_t vocab_size() const;
  bool is_special(uint32_t id) const { return added_.is_special(id); }
  const std::vector<AddedToken>& added_tokens() const { return added_.tokens(); }

 private:
  Tokenizer();
  void encode_text(std::string_view text, std::vector<uint32_t>& out) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::vector<std::unique_ptr<PreTokenizer>> pre_;
  std::unique_ptr<PostProcessor> post_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  bool byte_input_ = false;  // the last pre-tokenizer is ByteLevel: feed raw bytes to the model
};

}  // namespace fathom::tok

#include "tokenizer/bpe.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace fathom::tok {

void MergeMap::reserve(size_t n) {
  size_t cap = 16;
  shift_ = 60;
  while (cap < n * 2) {
    cap <<= 1;
    --shift_;
  }
  table_.assign(cap, Entry{});
  mask_ = cap - 1;
  size_ = 0;
}

void MergeMap::insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
  if ((size_ + 1) * 2 > table_.size()) {
    std::vector<Entry> old;
    old.swap(table_);
    reserve(std::max<size_t>(size_ + 1, old.size()));
    for (auto& e : old)
      if (e.key != kEmpty) insert(uint32_t(e.key >> 32), uint32_t(e.key), e.rank, e.id);
  }
  uint64_t key = (uint64_t(a) << 32) | b;
  size_t i = slot(key);
  while (table_[i].key != kEmpty && table_[i].key != key) i = (i + 1) & mask_;
  if (table_[i].key == kEmpty) ++size_;
  table_[i] = Entry{key, rank, id};
}

// A direct-mapped cache of word -> ids. Each slot keeps its last word; a new word overwrites.
struct BpeModel::Cache {
  static constexpr size_t kSlots = 1 << 16;
  static constexpr size_t kShards = 64;
  static constexpr size_t kMaxWord = 256;  // HF caches words shorter than 256 characters too
  struct Slot {
    size_t hash = 0;
    std::string key;
    std::vector<uint32_t> ids;
    bool used = false;
  };
  std::vector<Slot> slots{kSlots};
  std::array<std::mutex, kShards> locks;
};

BpeModel::~BpeModel() = default;

BpeModel::BpeModel(const nlohmann::json& m) : cache_(std::make_unique<Cache>()) {
  std::string type = m.value("type", "BPE");
  if (type != "BPE") fail("unsupported model type '", type, "' in tokenizer.json");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    fail("unsupported BPE dropout in tokenizer.json (only null or 0 is supported)");
  const auto& vocab = m.at("vocab");
  vocab_.reserve(vocab.size() * 2);
  uint32_t max_id = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    uint32_t id = it.value().get<uint32_t>();
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id + 1);
  }
  id_to_token_.resize(max_id);
  has_id_.assign(max_id, false);
  for (auto& [tok, id] : vocab_) {
    id_to_token_[id] = tok;
    has_id_[id] = true;
  }
  auto str_or_empty = [&](const char* key) {
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  prefix_ = str_or_empty("continuing_subword_prefix");
  suffix_ = str_or_empty("end_of_word_suffix");
  ignore_merges_ = m.value("ignore_merges", false);
  fuse_unk_ = m.value("fuse_unk", false);
  byte_fallback_ = m.value("byte_fallback", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    std::string unk = m["unk_token"].get<std::string>();
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) fail("BPE unk_token '", unk, "' is not in the vocab of tokenizer.json");
    unk_id_ = it->second;
  }

  const auto& merges = m.at("merges");
  merges_.reserve(merges.size());
  std::string new_tok;
  uint32_t rank = 0;
  for (const auto& mg : merges) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string& s = mg.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) fail("invalid merge '", s, "' in tokenizer.json (expected 'a b')");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2) {
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    } else {
      fail("invalid merge ", mg.dump(), " in tokenizer.json");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end()) fail("merge token '", a, "' is not in the vocab of tokenizer.json");
    if (ib == vocab_.end()) fail("merge token '", b, "' is not in the vocab of tokenizer.json");
    std::string_view bs = b;
    if (!prefix_.empty() && bs.substr(0, prefix_.size()) == prefix_) bs.remove_prefix(prefix_.size());
    new_tok = a;
    new_tok += bs;
    auto in = vocab_.find(new_tok);
    if (in == vocab_.end()) fail("merged token '", new_tok, "' is not in the vocab of tokenizer.json");
    merges_.insert(ia->second, ib->second, rank++, in->second);
  }

  // Raw-byte fast path.
  if (prefix_.empty() && suffix_.empty()) {
    const auto& alpha = ByteLevelAlphabet::get();
    byte_fast_ = true;
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(alpha.byte_to_utf8[b]);
      if (it == vocab_.end()) {
        byte_fast_ = false;
        break;
      }
      byte_id_[b] = it->second;
    }
    if (byte_fast_ && ignore_merges_) {
      byte_vocab_.reserve(vocab_.size() * 2);
      std::string raw;
      for (auto& [tok, id] : vocab_) {
        raw.clear();
        if (byte_level_to_bytes(tok, raw)) byte_vocab_.emplace(raw, id);
      }
    }
  }
}

std::optional<uint32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(uint32_t id) const {
  if (id >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::merge(std::vector<uint32_t>& syms) const {
  size_t n = syms.size();
  if (n < 2) return;
  if (n > 64) return merge_long(syms);
  constexpr uint32_t kNone = ~uint32_t(0);
  uint32_t rank[64], nid[64];
  for (size_t i = 0; i + 1 < n; ++i)
    if (!merges_.find(syms[i], syms[i + 1], rank[i], nid[i])) rank[i] = kNone;
  while (n > 1) {
    size_t best = 0;
    uint32_t br = rank[0];
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < br) {
        br = rank[i];
        best = i;
      }
    if (br == kNone) break;
    syms[best] = nid[best];
    // Remove symbol best+1 and pair best+1.
    for (size_t i = best + 1; i + 1 < n; ++i) syms[i] = syms[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      nid[i] = nid[i + 1];
    }
    --n;
    if (best + 1 < n && !merges_.find(syms[best], syms[best + 1], rank[best], nid[best])) rank[best] = kNone;
    if (best > 0 && !merges_.find(syms[best - 1], syms[best], rank[best - 1], nid[best - 1])) rank[best - 1] = kNone;
  }
  syms.resize(n);
}

// HF Word::merge_all: a priority queue of (rank, position) over a linked list of symbols.
void BpeModel::merge_long(std::vector<uint32_t>& syms) const {
  struct Sym {
    uint32_t id;
    int prev, next;
    bool alive;
  };
  struct Cand {
    uint32_t rank;
    uint32_t pos;
    uint32_t new_id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int n = static_cast<int>(syms.size());
  std::vector<Sym> s(n);
  for (int i = 0; i < n; ++i) s[i] = {syms[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Cand> q;
  uint32_t r, id;
  for (int i = 0; i + 1 < n; ++i)
    if (merges_.find(s[i].id, s[i + 1].id, r, id)) q.push({r, uint32_t(i), id});
  while (!q.empty()) {
    Cand c = q.top();
    q.pop();
    Sym& cur = s[c.pos];
    if (!cur.alive || cur.next < 0) continue;
    Sym& right = s[cur.next];
    if (!merges_.find(cur.id, right.id, r, id) || id != c.new_id) continue;
    cur.id = c.new_id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) s[cur.next].prev = static_cast<int>(c.pos);
    if (cur.prev >= 0 && merges_.find(s[cur.prev].id, cur.id, r, id)) q.push({r, uint32_t(cur.prev), id});
    if (cur.next >= 0 && merges_.find(cur.id, s[cur.next].id, r, id)) q.push({r, c.pos, id});
  }
  size_t k = 0;
  for (int i = 0; i < n; ++i)
    if (s[i].alive) syms[k++] = s[i].id;
  syms.resize(k);
}

bool BpeModel::cache_get(std::string_view key, size_t hash, std::vector<uint32_t>& out) const {
  size_t idx = hash & (Cache::kSlots - 1);
  std::lock_guard<std::mutex> lk(cache_->locks[idx % Cache::kShards]);
  const auto& slot = cache_->slots[idx];
  if (!slot.used || slot.hash != hash || slot.key != key) return false;
  out.insert(out.end(), slot.ids.begin(), slot.ids.end());
  return true;
}

void BpeModel::cache_put(std::string_view key, size_t hash, const uint32_t* ids, size_t n) const {
  size_t idx = hash & (Cache::kSlots - 1);
  std::lock_guard<std::mutex> lk(cache_->locks[idx % Cache::kShards]);
  auto& slot = cache_->slots[idx];
  slot.hash = hash;
  slot.key.assign(key);
  slot.ids.assign(ids, ids + n);
  slot.used = true;
}

void BpeModel::tokenize_bytes(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.empty()) return;
  if (!byte_fast_) {
    tokenize(bytes_to_byte_level(piece), out);
    return;
  }
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = byte_vocab_.find(piece);
    if (it != byte_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = piece.size() < Cache::kMaxWord;
  size_t hash = 0;
  if (cacheable) {
    hash = StringHash{}(piece);
    if (cache_get(piece, hash, out)) return;
  }
  thread_local std::vector<uint32_t> syms;
  syms.resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) syms[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  merge(syms);
  if (cacheable) cache_put(piece, hash, syms.data(), syms.size());
  out.insert(out.end(), syms.begin(), syms.end());
}

void BpeModel::tokenize(std::string_view w, std::vector<uint32_t>& out) const {
  if (w.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(w);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = w.size() < Cache::kMaxWord;
  // Tag the hash so char-mode words never collide with raw-byte words in the shared cache.
  size_t hash = 0;
  if (cacheable) {
    hash = StringHash{}(w) ^ 0x5bd1e995u;
    if (cache_get(w, hash, out)) return;
  }
  thread_local std::vector<uint32_t> syms;
  syms.clear();
  std::optional<std::pair<uint32_t, size_t>> unk;
  std::string s;
  size_t i = 0;
  while (i < w.size()) {
    size_t b = i;
    utf8_next(w, i);
    bool is_first = b == 0, is_last = i >= w.size();
    s.assign(w.substr(b, i - b));
    size_t byte_len = s.size();
    if (!is_first && !prefix_.empty()) s.insert(0, prefix_);
    if (is_last && !suffix_.empty()) s += suffix_;
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      if (unk) {
        syms.push_back(unk->first);
        unk.reset();
      }
      syms.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<uint32_t> bytes;
      bool ok = true;
      for (size_t k = b; k < i; ++k) {
        char code[8];
        std::snprintf(code, sizeof(code), "<0x%02X>", static_cast<unsigned char>(w[k]));
        auto bt = vocab_.find(std::string_view(code));
        if (bt == vocab_.end()) {
          ok = false;
          break;
        }
        bytes.push_back(bt->second);
      }
      if (ok) {
        if (unk) {
          syms.push_back(unk->first);
          unk.reset();
        }
        syms.insert(syms.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (unk_id_) {
      if (unk && fuse_unk_) {
        unk->second += byte_len;
      } else {
        if (unk) syms.push_back(unk->first);
        unk = std::make_pair(*unk_id_, byte_len);
      }
    }
  }
  if (unk) syms.push_back(unk->first);
  merge(syms);
  if (cacheable) cache_put(w, hash, syms.data(), syms.size());
  out.insert(out.end(), syms.begin(), syms.end());
}

}  // namespace fathom::tok

// The schema document: $ref resolution inside it, draft spellings, and what is ignored.
#include <set>

#include "core/error.h"
#include "grammar/schema_compiler.h"

namespace fathom::grammar::schema {

namespace {

// Keywords that constrain instances (2020-12 names after normalize); everything else is an
// annotation or unknown, and JSON Schema says those never constrain.
const std::set<std::string> kValidation = {
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "contains", "items", "prefixItems", "maxProperties", "minProperties", "required",
    "dependentRequired", "dependentSchemas", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "unevaluatedProperties",
    "unevaluatedItems", "$ref", "$dynamicRef", "$recursiveRef"};

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

void refuse(const std::string& keyword, const std::string& path, const std::string& why) {
  fail("json schema: unsupported keyword '", keyword, "' at ", path, ": ", why);
}

void no_instance(const std::string& keyword, const std::string& path, const std::string& why) {
  throw NoInstance("json schema: unsupported keyword '" + keyword + "' at " + path + ": " + why);
}

// `ref` resolved against the base URI (RFC 3986, the cases schemas use).
static std::string join_uri(const std::string& base, const std::string& ref) {
  if (ref.empty()) return base;
  if (ref.find("://") != std::string::npos || ref.rfind("urn:", 0) == 0 || base.empty()) return ref;
  if (ref[0] == '#') return base.substr(0, base.find('#')) + ref;
  size_t scheme = base.find("://");
  if (ref[0] == '/') {
    size_t path = scheme == std::string::npos ? 0 : base.find('/', scheme + 3);
    return (path == std::string::npos ? base : base.substr(0, path)) + ref;
  }
  size_t slash = base.rfind('/');
  return (slash == std::string::npos ? "" : base.substr(0, slash + 1)) + ref;
}

SchemaDoc::SchemaDoc(const Json& root) : root_(root) {
  if (root.is_object() && root.contains("$id") && root["$id"].is_string()) base_ = root["$id"].get<std::string>();
  if (!base_.empty() && base_.back() == '#') base_.pop_back();
  index(root, base_);
}

void SchemaDoc::index(const Json& node, std::string base) {
  if (node.is_array()) {
    for (const Json& v : node) index(v, base);
    return;
  }
  if (!node.is_object()) return;
  for (const char* key : {"$id", "id"}) {
    auto it = node.find(key);
    if (it == node.end() || !it->is_string()) continue;
    std::string id = it->get<std::string>();
    if (!id.empty() && id[0] == '#') {
      ids_.emplace(join_uri(base, id), &node);  // draft-07 location-independent identifier
      ids_.emplace(id, &node);
    } else {
      if (!id.empty() && id.back() == '#') id.pop_back();
      base = join_uri(base, id);
      ids_.emplace(base, &node);
      if (size_t slash = base.rfind('/'); slash != std::string::npos) tails_[base.substr(slash + 1)].push_back(&node);
    }
    break;
  }
  if (auto it = node.find("$anchor"); it != node.end() && it->is_string()) {
    ids_.emplace(base + "#" + it->get<std::string>(), &node);
    ids_.emplace("#" + it->get<std::string>(), &node);
  }
  for (auto& [k, v] : node.items())
    if (k != "enum" && k != "const" && k != "examples" && k != "default") index(v, base);
}

const Json& SchemaDoc::resolve(const std::string& ref, const std::string& path) const {
  size_t hash = ref.find('#');
  std::string base = ref.substr(0, hash), frag = hash == std::string::npos ? "" : ref.substr(hash + 1);
  const Json* node = &root_;
  std::string node_base = base_;
  if (!base.empty()) {
    node_base = join_uri(base_, base);
    auto it = ids_.find(node_base);
    if (it == ids_.end()) it = ids_.find(base);
    if (it != ids_.end()) {
      node = it->second;
    } else {  // a relative $ref written against a nested $id: its last segment, if unique
      size_t slash = base.rfind('/');
      auto t = tails_.find(slash == std::string::npos ? base : base.substr(slash + 1));
      if (t == tails_.end() || t->second.size() != 1) refuse("$ref", path, "'" + ref + "' points outside the document");
      node = t->second[0];
    }
  }
  if (frag.empty()) return *node;
  if (frag[0] != '/') {
    auto it = ids_.find(node_base + "#" + frag);
    if (it == ids_.end()) it = ids_.find("#" + frag);
    if (it == ids_.end()) refuse("$ref", path, "anchor '" + ref + "' not found");
    return *it->second;
  }
  frag = percent_decode(frag);
  for (size_t i = 0; i < frag.size();) {
    size_t j = frag.find('/', i + 1);
    if (j == std::string::npos) j = frag.size();
    std::string key = frag.substr(i + 1, j - i - 1);
    for (size_t k; (k = key.find("~1")) != std::string::npos;) key.replace(k, 2, "/");
    for (size_t k; (k = key.find("~0")) != std::string::npos;) key.replace(k, 2, "~");
    if (node->is_object() && node->contains(key)) {
      node = &(*node)[key];
    } else if (node->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
               std::stoul(key) < node->size()) {
      node = &(*node)[std::stoul(key)];
    } else {
      refuse("$ref", path, "'" + ref + "' points nowhere");
    }
    i = j;
  }
  return *node;
}

Json normalize(const Json& s, const std::string& path, std::vector<std::string>& ignored) {
  if (!s.is_object()) return s;
  Json out = Json::object();
  for (auto& [k, v] : s.items()) {
    if (kValidation.count(k)) out[k] = v;
    else if (k != "$defs" && k != "definitions") ignored.push_back(path + ": " + k);
  }
  // draft-04: boolean exclusiveMinimum/exclusiveMaximum modify minimum/maximum.
  for (auto [ex, bound] : {std::pair{"exclusiveMinimum", "minimum"}, std::pair{"exclusiveMaximum", "maximum"}}) {
    if (!out.contains(ex) || !out[ex].is_boolean()) continue;
    bool on = out[ex].get<bool>();
    out.erase(ex);
    if (on && out.contains(bound)) {
      out[ex] = out[bound];
      out.erase(bound);
    }
  }
  // draft-2019 and before: items as an array, additionalItems for the rest.
  if (out.contains("items") && out["items"].is_array()) {
    out["prefixItems"] = out["items"];
    out.erase("items");
    if (s.contains("additionalItems")) out["items"] = s["additionalItems"];
  }
  // draft-07 dependencies: arrays are dependentRequired, schemas dependentSchemas.
  if (auto it = s.find("dependencies"); it != s.end() && it->is_object()) {
    for (auto& [k, v] : it->items()) {
      if (v.is_array()) out["dependentRequired"][k] = v;
      else out["dependentSchemas"][k] = v;
    }
  }
  if (!out.contains("if")) out.erase("then"), out.erase("else");
  else if (!out.contains("then") && !out.contains("else")) out.erase("if");
  // An integer-valued multipleOf of 1 on numbers means integers.
  return out;
}

Json SchemaCompiler::norm(const Json& s, const std::string& path) {
  std::vector<std::string> ignored;
  Json out = normalize(s, path, ignored);
  if (report_) report_->ignored.insert(report_->ignored.end(), ignored.begin(), ignored.end());
  return out;
}

std::vector<std::string> types_of(const Json& s) {
  static const std::vector<std::string> kAll = {"object", "array", "string", "number", "integer", "boolean", "null"};
  if (!s.is_object() || !s.contains("type")) return kAll;
  const Json& t = s["type"];
  std::vector<std::string> out;
  if (t.is_string()) out.push_back(t.get<std::string>());
  else if (t.is_array())
    for (const Json& x : t)
      if (x.is_string()) out.push_back(x.get<std::string>());
  return out;
}

}  // namespace fathom::grammar::schema

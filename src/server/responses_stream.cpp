#include "server/responses_stream.h"

#include "server/chat_sse.h"
#include "server/openai_responses.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

// "event: <type>\ndata: <json>\n\n", with the stream's next sequence number.
std::string ResponsesStream::event(json data) {
  data["sequence_number"] = sequence_++;
  return "event: " + data.at("type").get<std::string>() + "\ndata: " +
         data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string ResponsesStream::start() {
  response_["status"] = "in_progress";
  response_["output"] = json::array();
  std::string out = event({{"type", "response.created"}, {"response", response_}});  // numbered in order
  return out + event({{"type", "response.in_progress"}, {"response", response_}});
}

std::string ResponsesStream::feed(std::string_view sse) {
  return map_chat_chunks(sse, [this](const json& chunk) { return on_chunk(chunk); });
}

std::string ResponsesStream::open(Item kind, json item) {
  std::string out = close();
  item_ = kind;
  text_.clear();
  output_.push_back(item);
  const int index = int(output_.size()) - 1;
  out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  if (kind == Item::Message)
    out += event({{"type", "response.content_part.added"}, {"item_id", item["id"]}, {"output_index", index},
                  {"content_index", 0}, {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  return out;
}

std::string ResponsesStream::close() {
  if (item_ == Item::None) return "";
  const int index = int(output_.size()) - 1;
  json& item = output_.back();
  const json id = item["id"];
  std::string out;
  if (item_ == Item::Reasoning) {
    item["content"] = json::array({{{"type", "reasoning_text"}, {"text", text_}}});
    out += event({{"type", "response.reasoning_text.done"}, {"item_id", id}, {"output_index", index},
                  {"content_index", 0}, {"text", text_}});
  } else if (item_ == Item::Message) {
    const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}, {"logprobs", json::array()}};
    item["content"] = json::array({part});
    out += event({{"type", "response.output_text.done"}, {"item_id", id}, {"output_index", index},
                  {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
    out += event({{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", index},
                  {"content_index", 0}, {"part", part}});
  } else {
    item["arguments"] = text_;
    out += event({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", index},
                  {"name", item["name"]}, {"arguments", text_}});
  }
  item["status"] = "completed";
  item_ = Item::None;
  return out + event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
}

std::string ResponsesStream::on_chunk(const json& chunk) {
  if (auto e = chunk.find("error"); e != chunk.end()) {
    if (error_.is_null()) error_ = *e;
    return "";
  }
  if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) usage_ = responses_usage(*u);
  const auto choices = chunk.find("choices");
  if (choices == chunk.end() || choices->empty()) return "";
  const json& c = choices->at(0);
  const json& d = c.value("delta", json::object());
  std::string out;
  if (auto r = d.find("reasoning_content"); r != d.end() && r->is_string() && !r->get<std::string>().empty()) {
    if (item_ != Item::Reasoning)
      out += open(Item::Reasoning, {{"id", new_id_("rs_")}, {"type", "reasoning"}, {"summary", json::array()},
                                    {"content", json::array()}, {"status", "in_progress"}});
    text_ += r->get<std::string>();
    out += event({{"type", "response.reasoning_text.delta"}, {"item_id", output_.back()["id"]},
                  {"output_index", int(output_.size()) - 1}, {"content_index", 0}, {"delta", *r}});
  }
  if (auto t = d.find("content"); t != d.end() && t->is_string() && !t->get<std::string>().empty()) {
    if (item_ != Item::Message)
      out += open(Item::Message, {{"id", new_id_("msg_")}, {"type", "message"}, {"status", "in_progress"},
                                  {"role", "assistant"}, {"content", json::array()}});
    text_ += t->get<std::string>();
    out += event({{"type", "response.output_text.delta"}, {"item_id", output_.back()["id"]},
                  {"output_index", int(output_.size()) - 1}, {"content_index", 0}, {"delta", *t},
                  {"logprobs", json::array()}});
  }
  if (auto calls = d.find("tool_calls"); calls != d.end() && calls->is_array())
    for (const auto& tc : *calls) {
      const int i = tc.value("index", 0);
      const json fn = tc.value("function", json::object());
      if (item_ != Item::Call || i != tool_index_) {  // a call's first chunk has its id and name
        tool_index_ = i;
        out += open(Item::Call, {{"id", new_id_("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
                                 {"call_id", tc.value("id", "")}, {"name", fn.value("name", "")}, {"arguments", ""}});
      }
      if (auto a = fn.find("arguments"); a != fn.end() && a->is_string() && !a->get<std::string>().empty()) {
        text_ += a->get<std::string>();
        out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", output_.back()["id"]},
                      {"output_index", int(output_.size()) - 1}, {"delta", *a}});
      }
    }
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) finish_reason_ = f->get<std::string>();
  return out;
}

std::string ResponsesStream::finish() {
  std::string out = close();
  if (!error_.is_null() || finish_reason_ == "abort") {
    const std::string msg = !error_.is_null() ? error_.value("message", "internal error")
                                              : "the request was aborted (the server is shutting down)";
    response_["status"] = "failed";
    response_["output"] = output_;
    response_["error"] = {{"code", "server_error"}, {"message", msg}};
    out += event({{"type", "error"}, {"code", "server_error"}, {"message", msg}, {"param", nullptr}});
    return out + event({{"type", "response.failed"}, {"response", response_}});
  }
  completed_ = true;
  const bool incomplete = finish_reason_ == "length";
  response_["status"] = incomplete ? "incomplete" : "completed";
  response_["incomplete_details"] = incomplete ? json{{"reason", "max_output_tokens"}} : json();
  response_["output"] = output_;
  response_["usage"] = usage_;
  return out + event({{"type", incomplete ? "response.incomplete" : "response.completed"}, {"response", response_}});
}

}  // namespace fathom::server

// The post-processors of processors.h on a single sequence's ids.
#include "processors.h"

namespace alpaca::tokenizer::detail {

struct PostProcessor::Node {
  enum Kind { kSequence, kTemplate, kByteLevel } kind;
  std::vector<Node> children;
  // TemplateProcessing's single template: -1 = the sequence, else a special token's ids.
  std::vector<std::vector<int64_t>> single;

  void apply(std::vector<int64_t>& ids) const {
    if (kind == kSequence) {
      for (const auto& c : children) c.apply(ids);
    } else if (kind == kTemplate) {
      std::vector<int64_t> out;
      out.reserve(ids.size() + 4);
      for (const auto& item : single) {
        if (item.size() == 1 && item[0] == -1) {
          out.insert(out.end(), ids.begin(), ids.end());
        } else {
          out.insert(out.end(), item.begin(), item.end());
        }
      }
      ids = std::move(out);
    }
  }

  // Ids before and after the sequence in the single template.
  void affixes(std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) const {
    if (kind == kSequence) {
      for (const auto& c : children) c.affixes(prefix, suffix);
      return;
    }
    if (kind != kTemplate) return;
    std::vector<int64_t> pre, post;
    bool seen = false;
    for (const auto& item : single) {
      if (item.size() == 1 && item[0] == -1) {
        seen = true;
      } else {
        (seen ? post : pre).insert((seen ? post : pre).end(), item.begin(), item.end());
      }
    }
    prefix->insert(prefix->begin(), pre.begin(), pre.end());
    suffix->insert(suffix->end(), post.begin(), post.end());
  }

  // One step of the type `t` (json_context.h's parse_component reads a Sequence).
  static Node parse_step(const std::string& t, const json& j, const JsonContext& ctx, const std::string& where) {
    Node p{};
    if (t == "ByteLevel") {
      p.kind = kByteLevel;  // only moves offsets (trim_offsets); ids are unchanged
    } else if (t == "RobertaProcessing" || t == "BertProcessing") {
      p.kind = kTemplate;  // single: cls $A sep (the pair form and offsets do not change single ids)
      for (const char* key : {"cls", "sep"}) {
        const json& v = ctx.get(j, key, where);
        if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
          ctx.fail(where, std::string("\"") + key + "\" must be [token, id]");
        if (std::string(key) == "sep") p.single.push_back({-1});
        p.single.push_back({v[1].get<int64_t>()});
      }
    } else if (t == "TemplateProcessing") {
      p.kind = kTemplate;
      const json& specials = ctx.get(j, "special_tokens", where);
      if (!specials.is_object()) ctx.fail(where, "\"special_tokens\" must be an object");
      const json& single = ctx.get(j, "single", where);
      if (!single.is_array()) ctx.fail(where, "\"single\" must be a list");
      for (const json& item : single) {
        if (item.is_object() && item.contains("Sequence")) {
          p.single.push_back({-1});
        } else if (item.is_object() && item.contains("SpecialToken")) {
          std::string id = ctx.str(item.at("SpecialToken"), "id", where + ".single");
          if (!specials.contains(id))
            ctx.fail(where, "special token \"" + id + "\" of the template is not in special_tokens");
          const json& ids = ctx.get(specials.at(id), "ids", where + ".special_tokens");
          std::vector<int64_t> v;
          for (const json& x : ids) {
            if (!x.is_number_integer()) ctx.fail(where, "special_tokens ids must be integers");
            v.push_back(x.get<int64_t>());
          }
          p.single.push_back(v);
        } else {
          ctx.fail(where, "template items must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " +
                              item.dump());
        }
      }
    } else {
      ctx.unsupported(where, "post-processor type", t,
                      "TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence");
    }
    return p;
  }
};

PostProcessor PostProcessor::parse(const json& j, const JsonContext& ctx, const std::string& where) {
  return PostProcessor(std::make_shared<const Node>(parse_component<Node>(j, ctx, where, "processors")));
}

void PostProcessor::apply(std::vector<int64_t>& ids) const { root_->apply(ids); }

void PostProcessor::affixes(std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) const {
  root_->affixes(prefix, suffix);
}

}  // namespace alpaca::tokenizer::detail

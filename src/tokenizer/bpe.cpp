// The `tokenizers` crate's BPE model (models/bpe/{model,word}.rs): merge ranks applied lowest
// first with the crate's priority queue, byte_fallback, ignore_merges, unk_token with fuse_unk,
// continuing_subword_prefix, end_of_word_suffix, and its per-word cache.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <queue>
#include <unordered_map>

#include "alpaca/util/error.h"
#include "json_context.h"
#include "tokenizer_model.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {
namespace {

std::atomic<uint64_t> g_instance{0};
constexpr size_t kCacheCapacity = 10000;
constexpr size_t kCacheMaxLength = 256;

struct Bpe final : TokenizerModel {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> tokens;  // id -> token, "" for holes
  std::unordered_map<uint64_t, std::pair<uint32_t, int64_t>> merges;  // (a, b) -> (rank, new id)
  std::optional<std::string> unk_token;
  std::optional<int64_t> unk_id;
  std::optional<std::string> prefix, suffix;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<int64_t, 256> byte_ids{};  // <0xHH> ids, -1 when absent
  uint64_t instance = 0;

  static uint64_t key(int64_t a, int64_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
  }

  const std::vector<std::string>& id_to_token() const override { return tokens; }
  const char* type() const override { return "BPE"; }

  std::optional<int64_t> lookup(const std::string& s) const override {
    auto it = vocab.find(s);
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  }

  struct Symbol {
    int64_t c;
    int64_t prev, next;
    size_t len;
  };
  struct Merge {
    size_t pos;
    uint32_t rank;
    int64_t new_id;
    bool operator<(const Merge& o) const {  // max-heap: smallest rank, then smallest pos on top
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };

  // The word's characters as vocabulary ids before any merge (Word::from in the crate): each
  // character (with the subword prefix / word suffix) its id, else its <0xNN> bytes with
  // byte_fallback, else the unk (consecutive unks fused with fuse_unk).
  std::vector<Symbol> symbols(const std::string& w) const {
    std::vector<Symbol> sym;
    sym.reserve(w.size());
    auto add = [&](int64_t id, size_t len) {
      int64_t n = static_cast<int64_t>(sym.size());
      sym.push_back({id, n - 1, -1, len});
      if (n > 0) sym[n - 1].next = n;
    };
    bool has_unk = false;  // a pending unk (fused over consecutive unknown characters)
    int64_t unk_c = 0;
    size_t unk_len = 0;
    std::string s;
    for (size_t i = 0, len = 0; i < w.size(); i += len) {
      decode_utf8(w, i, &len);
      const bool first = i == 0, last = i + len >= w.size();
      s.assign(w, i, len);
      if (!first && prefix) s = *prefix + s;
      if (last && suffix) s += *suffix;
      if (auto id = lookup(s)) {
        if (has_unk) {
          add(unk_c, unk_len);
          has_unk = false;
        }
        add(*id, len);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (unsigned char b : s) all = all && byte_ids[b] >= 0;
        if (all) {
          for (unsigned char b : s) add(byte_ids[b], 1);
          continue;
        }
      }
      if (unk_token) {
        ALPACA_CHECK(unk_id, "the BPE unk_token '" << *unk_token << "' is not in the vocabulary");
        if (has_unk && fuse_unk) {
          unk_len += len;
        } else {
          if (has_unk) add(unk_c, unk_len);
          has_unk = true;
          unk_c = *unk_id;
          unk_len = len;
        }
      }
    }
    if (has_unk) add(unk_c, unk_len);
    return sym;
  }

  void merge_word(const std::string& w, std::vector<int64_t>* out) const {
    std::vector<Symbol> sym = symbols(w);
    std::priority_queue<Merge> queue;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges.find(key(sym[i].c, sym[i + 1].c));
      if (it != merges.end()) queue.push({i, it->second.first, it->second.second});
    }
    while (!queue.empty()) {
      Merge top = queue.top();
      queue.pop();
      Symbol& cur = sym[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const size_t next_pos = static_cast<size_t>(cur.next);
      const Symbol right = sym[next_pos];
      auto it = merges.find(key(cur.c, right.c));
      if (it == merges.end() || it->second.second != top.new_id) continue;
      cur.c = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      sym[next_pos].len = 0;
      if (right.next > -1 && static_cast<size_t>(right.next) < sym.size())
        sym[static_cast<size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
      if (cur.prev >= 0) {
        auto p = merges.find(key(sym[static_cast<size_t>(cur.prev)].c, cur.c));
        if (p != merges.end())
          queue.push({static_cast<size_t>(cur.prev), p->second.first, p->second.second});
      }
      if (cur.next >= 0 && static_cast<size_t>(cur.next) < sym.size()) {
        auto n = merges.find(key(cur.c, sym[static_cast<size_t>(cur.next)].c));
        if (n != merges.end()) queue.push({top.pos, n->second.first, n->second.second});
      }
    }
    for (const auto& x : sym)
      if (x.len != 0) out->push_back(x.c);
  }

  void tokenize(const std::string& s, std::vector<int64_t>* out) const override {
    if (s.empty()) return;
    if (ignore_merges) {
      if (auto id = lookup(s)) {
        out->push_back(*id);
        return;
      }
    }
    // Per-thread word cache, as the library's (capacity 10,000 words shorter than 256 bytes).
    thread_local std::unordered_map<uint64_t, std::unordered_map<std::string, std::vector<int64_t>>> caches;
    if (caches.size() > 8 && !caches.count(instance)) caches.clear();  // tokenizers come and go
    auto& cache = caches[instance];
    auto hit = cache.find(s);
    if (hit != cache.end()) {
      out->insert(out->end(), hit->second.begin(), hit->second.end());
      return;
    }
    const size_t before = out->size();
    merge_word(s, out);
    if (s.size() < kCacheMaxLength && cache.size() < kCacheCapacity)
      cache.emplace(s, std::vector<int64_t>(out->begin() + static_cast<std::ptrdiff_t>(before), out->end()));
  }

  static std::unique_ptr<Bpe> parse(const json& j, const JsonContext& ctx) {
    const std::string where = "model";
    auto owned = std::make_unique<Bpe>();
    Bpe& m = *owned;
    m.instance = ++g_instance;
    if (j.contains("dropout") && !j.at("dropout").is_null()) {
      const json& d = j.at("dropout");
      if (!d.is_number() || d.get<double>() != 0.0)
        ctx.fail(where, "BPE dropout " + d.dump() + " is not supported (supported: null or 0)");
    }
    const json& vocab = ctx.get(j, "vocab", where);
    if (!vocab.is_object()) ctx.fail(where, "\"vocab\" must map token -> id");
    m.vocab.reserve(vocab.size());
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
        ctx.fail(where, "vocab id of " + json(it.key()).dump() + " must be a non-negative integer");
      int64_t id = it.value().get<int64_t>();
      m.vocab[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    if (max_id >= static_cast<int64_t>(vocab.size()) + kMaxVocabHoles)
      ctx.fail(where, "vocab id " + std::to_string(max_id) + " is far beyond the vocabulary's " +
                          std::to_string(vocab.size()) + " entries (a corrupt id?)");
    m.tokens.assign(static_cast<size_t>(max_id + 1), std::string());
    for (const auto& [tok, id] : m.vocab) m.tokens[static_cast<size_t>(id)] = tok;
    m.unk_token = ctx.opt_str(j, "unk_token", where);
    if (m.unk_token) m.unk_id = m.lookup(*m.unk_token);
    m.prefix = ctx.opt_str(j, "continuing_subword_prefix", where);
    m.suffix = ctx.opt_str(j, "end_of_word_suffix", where);
    m.fuse_unk = ctx.boolean(j, "fuse_unk", false, where);
    m.byte_fallback = ctx.boolean(j, "byte_fallback", false, where);
    m.ignore_merges = ctx.boolean(j, "ignore_merges", false, where);
    for (int b = 0; b < 256; ++b) {
      char code[8];
      std::snprintf(code, sizeof code, "<0x%02X>", b);
      m.byte_ids[b] = m.lookup(code).value_or(-1);
    }
    const json& merges = ctx.get(j, "merges", where);
    if (!merges.is_array()) ctx.fail(where, "\"merges\" must be a list");
    const size_t prefix_len = m.prefix ? m.prefix->size() : 0;
    m.merges.reserve(merges.size());
    uint32_t rank = 0;
    for (const json& x : merges) {
      std::string a, b;
      if (x.is_string()) {
        const std::string s = x.get<std::string>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          ctx.fail(where, "merge " + x.dump() + " must be two tokens separated by one space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {
        a = x[0].get<std::string>();
        b = x[1].get<std::string>();
      } else {
        ctx.fail(where, "merge " + x.dump() + " must be \"a b\" or [\"a\", \"b\"]");
      }
      auto ia = m.lookup(a), ib = m.lookup(b);
      if (!ia || !ib) ctx.fail(where, "merge " + x.dump() + " uses a token that is not in the vocab");
      const std::string merged = a + (b.size() >= prefix_len ? b.substr(prefix_len) : std::string());
      auto in = m.lookup(merged);
      if (!in) ctx.fail(where, "merge " + x.dump() + " makes " + json(merged).dump() +
                                   ", which is not in the vocab");
      m.merges[key(*ia, *ib)] = {rank++, *in};
    }
    return owned;
  }
};

}  // namespace

std::unique_ptr<TokenizerModel> parse_bpe(const json& model, const std::string& file) {
  return Bpe::parse(model, JsonContext(file));
}

}  // namespace alpaca::tokenizer::detail

#include "node/config.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "transport/crypto.hpp"

namespace grove::node {

namespace {
constexpr std::string_view kMagic = "grove-run v1";

std::string fmt_float(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));  // round-trips a float exactly
  return b;
}

bool parse_u64(std::string_view s, std::uint64_t& out) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_float(std::string_view s, float& out) {
  if (s.empty() || s.size() > 24) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && std::isfinite(out);
}

bool is_hex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool is_word(std::string_view s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// One field: its key, how it is printed, and how it is read back.
struct Field {
  std::string_view key;
  std::function<std::string(const RunConfig&)> get;
  std::function<bool(RunConfig&, std::string_view)> set;
};

template <class T>
Field u32_field(std::string_view key, T RunConfig::*m) {
  return {key, [m](const RunConfig& c) { return std::to_string(c.*m); },
          [m](RunConfig& c, std::string_view v) {
            std::uint64_t x = 0;
            if (!parse_u64(v, x) || x > 0xffffffffu) return false;
            c.*m = static_cast<T>(x);
            return true;
          }};
}

Field float_field(std::string_view key, float RunConfig::*m) {
  return {key, [m](const RunConfig& c) { return fmt_float(c.*m); },
          [m](RunConfig& c, std::string_view v) { return parse_float(v, c.*m); }};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"workload", [](const RunConfig& c) { return std::string(to_string(c.workload)); },
       [](RunConfig& c, std::string_view v) {
         auto w = parse_workload(v);
         if (w) c.workload = *w;
         return w.has_value();
       }},
      {"model", [](const RunConfig& c) { return c.model; },
       [](RunConfig& c, std::string_view v) {
         if (!is_word(v)) return false;
         c.model = std::string(v);
         return true;
       }},
      {"model_params", [](const RunConfig& c) { return std::to_string(c.model_params); },
       [](RunConfig& c, std::string_view v) { return parse_u64(v, c.model_params); }},
      u32_field("model_tensors", &RunConfig::model_tensors),
      {"model_spec", [](const RunConfig& c) { return c.model_spec; },
       [](RunConfig& c, std::string_view v) {
         if (v != "-" && (v.size() != 64 || !is_hex(v))) return false;
         c.model_spec = std::string(v);
         return true;
       }},
      {"seed", [](const RunConfig& c) { return std::to_string(c.seed); },
       [](RunConfig& c, std::string_view v) { return parse_u64(v, c.seed); }},
      {"nonce", [](const RunConfig& c) { return c.nonce; },
       [](RunConfig& c, std::string_view v) {
         if (v.size() != 16 || !is_hex(v)) return false;
         c.nonce = std::string(v);
         return true;
       }},
      u32_field("inner_steps", &RunConfig::inner_steps),
      u32_field("batch", &RunConfig::batch),
      u32_field("seq_len", &RunConfig::seq_len),
      float_field("lr", &RunConfig::lr),
      u32_field("warmup", &RunConfig::warmup),
      u32_field("schedule_steps", &RunConfig::schedule_steps),
      float_field("lr_min_ratio", &RunConfig::lr_min_ratio),
      float_field("weight_decay", &RunConfig::weight_decay),
      float_field("beta1", &RunConfig::beta1),
      float_field("beta2", &RunConfig::beta2),
      float_field("clip", &RunConfig::clip),
      {"outer", [](const RunConfig& c) { return c.outer_name(); },
       [](RunConfig& c, std::string_view v) { return c.set_outer(v); }},
      float_field("outer_lr", &RunConfig::outer_lr),
      float_field("outer_momentum", &RunConfig::outer_momentum),
      u32_field("outer_warmup", &RunConfig::outer_warmup),
      float_field("noloco_alpha", &RunConfig::noloco_alpha),
      float_field("noloco_beta", &RunConfig::noloco_beta),
      float_field("noloco_gamma", &RunConfig::noloco_gamma),
      u32_field("noloco_group", &RunConfig::noloco_group),
      float_field("noloco_lookahead", &RunConfig::noloco_lookahead),
      u32_field("noloco_nesterov", &RunConfig::noloco_nesterov),
      u32_field("noloco_warmup", &RunConfig::noloco_warmup),
      {"codec", [](const RunConfig& c) { return std::string(to_string(c.codec)); },
       [](RunConfig& c, std::string_view v) {
         auto k = parse_codec(v);
         if (k) c.codec = *k;
         return k.has_value();
       }},
      u32_field("topk", &RunConfig::topk),
      u32_field("topk_chunk", &RunConfig::topk_chunk),
      u32_field("topk_bits", &RunConfig::topk_bits),
      float_field("error_decay", &RunConfig::error_decay),
      float_field("demo_decay", &RunConfig::demo_decay),
      u32_field("demo_topk", &RunConfig::demo_topk),
      u32_field("demo_chunk", &RunConfig::demo_chunk),
      u32_field("fragments", &RunConfig::fragments),
      u32_field("overlap", &RunConfig::overlap),
      u32_field("window_ms", &RunConfig::window_ms),
      {"data", [](const RunConfig& c) { return std::string(to_string(c.data)); },
       [](RunConfig& c, std::string_view v) {
         if (v == "synthetic")
           c.data = DataKind::synthetic;
         else if (v == "files")
           c.data = DataKind::files;
         else
           return false;
         return true;
       }},
      u32_field("eval_every", &RunConfig::eval_every),
      u32_field("eval_batches", &RunConfig::eval_batches),
  };
  return f;
}

transport::Result<RunConfig> bad(std::string what) {
  return {transport::errc::malformed, std::move(what)};
}
}  // namespace

const char* to_string(WorkloadKind w) {
  switch (w) {
    case WorkloadKind::gpt:
      return "gpt";
    case WorkloadKind::mlp:
      return "mlp";
    case WorkloadKind::external:
      return "external";
  }
  return "?";
}
const char* to_string(DataKind d) {
  return d == DataKind::synthetic ? "synthetic" : "files";
}
std::optional<WorkloadKind> parse_workload(std::string_view s) {
  if (s == "gpt") return WorkloadKind::gpt;
  if (s == "mlp") return WorkloadKind::mlp;
  if (s == "external") return WorkloadKind::external;
  return std::nullopt;
}
std::string RunConfig::to_text() const {
  std::string t(kMagic);
  t += '\n';
  for (const auto& f : fields()) {
    t += f.key;
    t += ' ';
    t += f.get(*this);
    t += '\n';
  }
  return t;
}

std::string RunConfig::hash_hex() const {
  const std::string t = to_text();
  const auto h =
      transport::blake2b_256({reinterpret_cast<const std::uint8_t*>(t.data()), t.size()});
  return transport::to_hex(h);
}

std::string RunConfig::run_name() const {
  return std::string(to_string(workload)) + "-" + hash_hex().substr(0, 12);
}

std::string RunConfig::check() const {
  const auto in = [](double v, double lo, double hi) { return v >= lo && v <= hi; };
  if (!is_word(model)) return "model: a preset name (letters, digits, _)";
  if (nonce.size() != 16 || !is_hex(nonce)) return "nonce: 16 lowercase hex digits";
  if (workload == WorkloadKind::external) {
    if (!in(static_cast<double>(model_params), 1, static_cast<double>(1ull << 36)))
      return "model params: 1 to 2^36";
    if (!in(model_tensors, 1, 100'000)) return "model tensors: 1 to 100000";
    if (model_spec.size() != 64 || !is_hex(model_spec)) return "model spec: 64 hex digits";
  } else if (model_params != 0 || model_tensors != 0 || model_spec != "-") {
    return "model params, tensors and spec belong to external workloads only";
  }
  if (!in(inner_steps, 1, 1'000'000)) return "inner steps: 1 to 1000000";
  if (!in(batch, 1, 4096)) return "batch: 1 to 4096";
  if (!in(seq_len, 2, 8192)) return "seq_len: 2 to 8192";
  if (!(lr > 0 && lr <= 1)) return "lr: above 0, at most 1";
  if (warmup > schedule_steps) return "warmup: at most schedule_steps";
  if (!in(schedule_steps, 1, 1'000'000'000)) return "schedule_steps: 1 to 1e9";
  if (!in(lr_min_ratio, 0, 1)) return "lr_min_ratio: 0 to 1";
  if (!in(weight_decay, 0, 1)) return "weight decay: 0 to 1";
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) return "betas: in [0, 1)";
  if (!in(clip, 0, 1e6)) return "clip: 0 (off) to 1e6";
  if (!(outer_lr > 0 && outer_lr <= 10)) return "outer lr: above 0, at most 10";
  if (!in(outer_momentum, 0, 0.999)) return "outer momentum: 0 to 0.999";
  if (!in(noloco_alpha, 0, 0.999)) return "noloco alpha: 0 to 0.999";
  if (!(noloco_beta > 0 && noloco_beta <= 2)) return "noloco beta: above 0, at most 2";
  if (!in(noloco_gamma, 0, 2)) return "noloco gamma: 0 to 2";
  if (!in(outer_warmup, 0, 1'000'000)) return "outer warm-up: 0 to 1000000 rounds";
  if (!in(noloco_group, 2, 64)) return "noloco group: 2 to 64 members";
  if (!in(noloco_lookahead, 0, 0.999)) return "noloco look-ahead: 0 to 0.999";
  if (noloco_nesterov > 1) return "noloco rule: 0 (the paper's) or 1 (nesterov)";
  if (!in(noloco_warmup, 0, 1'000'000)) return "noloco warm-up: 0 to 1000000 rounds";
  if (!in(topk_chunk, 64, 65536) || (topk_chunk & (topk_chunk - 1)) != 0)
    return "top-k chunk: a power of two, 64 to 65536";
  if (!in(topk, 1, topk_chunk)) return "top-k: 1 to the chunk";
  if (topk_bits != 32 && topk_bits != 2) return "top-k value bits: 32 or 2";
  if (!in(error_decay, 0, 1)) return "error decay: 0 to 1";
  if (!in(fragments, 1, 64)) return "fragments: 1 to 64";
  if (!in(overlap, 0, 1)) return "overlap: 0 or 1";
  if (demo && !per_step) return "demo is a per-step run";
  if (per_step && !demo && workload != WorkloadKind::external)
    return "outer none (per-step collectives only) needs --workload external: a trainer's "
           "collectives are the run's only synchronisation";
  if (demo && workload == WorkloadKind::external)
    return "outer demo steps a built-in workload; a PyTorch trainer runs DeMo itself "
           "(grove.demo(model), on a run with outer none)";
  if (per_step && (fragments > 1 || overlap))
    return std::string("outer ") + (demo ? "demo" : "none") + " has no rounds to cut or overlap";
  if (!in(demo_decay, 0, 0.999999)) return "demo decay: 0 to below 1";
  if (!in(demo_topk, 1, 65536)) return "demo top-k: 1 to 65536";
  if (!in(demo_chunk, 1, 256)) return "demo chunk: 1 to 256";
  if (inner_steps % fragments != 0)
    return "fragments: must divide the inner steps (" + std::to_string(inner_steps) +
           "): a round every inner_steps / fragments steps";
  if (!in(window_ms, 500, 600'000)) return "window: 500 to 600000 ms";
  if (!in(eval_every, 1, 1'000'000)) return "eval every: 1 to 1000000";
  if (!in(eval_batches, 1, 10'000)) return "eval batches: 1 to 10000";
  return {};
}

std::string RunConfig::outer_name() const {
  if (per_step) return demo ? "demo" : "none";
  return sparseloco && outer == OuterMode::diloco ? "sparseloco" : to_string(outer);
}

std::string RunConfig::wire_name() const {
  std::string w;
  if (demo)
    return "DeMo every step: top-" + std::to_string(demo_topk) + " DCT coefficients per block of " +
           std::to_string(demo_chunk) + " (fp32)";
  if (per_step) return "the trainers' per-step collectives (no outer rounds)";
  if (outer == OuterMode::diloco && sparseloco)
    w = "top-" + std::to_string(topk) + "/" + std::to_string(topk_chunk) + " " +
        (topk_bits == 2 ? "2-bit" : "fp32") + " + error feedback";
  else if (compressed_rounds())
    w = "e3m0 + error feedback";
  else
    w = to_string(codec);
  if (fragments > 1) w += ", 1/" + std::to_string(fragments) + " of the model a round";
  return w;
}

bool RunConfig::set_outer(std::string_view name) {
  if (name == "sparseloco") {
    outer = OuterMode::diloco;
    sparseloco = true;
    per_step = false;
    demo = false;
    return true;
  }
  if (name == "none" || name == "demo") {  // per-step runs (outer stays noloco: it never runs)
    outer = OuterMode::noloco;
    sparseloco = false;
    per_step = true;
    demo = name == "demo";
    return true;
  }
  const auto m = parse_mode(name);
  if (!m) return false;
  outer = *m;
  sparseloco = false;
  per_step = false;
  demo = false;
  return true;
}

transport::Result<RunConfig> parse_run_config(std::string_view text) {
  if (text.size() > kMaxConfigText)
    return bad("config text is " + std::to_string(text.size()) + " bytes (at most " +
               std::to_string(kMaxConfigText) + ")");
  std::vector<std::string_view> lines;
  for (std::size_t at = 0; at < text.size();) {
    const auto nl = text.find('\n', at);
    if (nl == std::string_view::npos) return bad("config text does not end with a newline");
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  const auto& fs = fields();
  if (lines.empty() || lines[0] != kMagic) return bad("not a grove-run v1 config");
  if (lines.size() != fs.size() + 1)
    return bad("config has " + std::to_string(lines.size() - 1) + " fields, expected " +
               std::to_string(fs.size()));
  RunConfig c;
  for (std::size_t i = 0; i < fs.size(); ++i) {
    const auto line = lines[i + 1];
    const auto sp = line.find(' ');
    if (sp == std::string_view::npos || line.substr(0, sp) != fs[i].key)
      return bad("line " + std::to_string(i + 2) + ": expected field '" + std::string(fs[i].key) +
                 "'");
    if (!fs[i].set(c, line.substr(sp + 1)))
      return bad("line " + std::to_string(i + 2) + ": bad value for '" + std::string(fs[i].key) +
                 "'");
  }
  if (auto e = c.check(); !e.empty()) return bad(e);
  if (c.to_text() != text) return bad("config text is not in canonical form");
  return c;
}

bool set_noloco_variant(RunConfig& c, std::string_view name) {
  RunConfig v;  // "grove": the defaults
  if (name == "paper") {
    const auto& p = optim::kNoLoCoPaper;
    v.noloco_alpha = p.alpha;
    v.noloco_beta = p.beta;
    v.noloco_gamma = p.gamma;
    v.noloco_group = 2;
    v.noloco_lookahead = p.lookahead;
    v.noloco_nesterov = p.nesterov ? 1 : 0;
    v.noloco_warmup = p.warmup;
  } else if (name != "grove") {
    return false;
  }
  c.noloco_alpha = v.noloco_alpha;
  c.noloco_beta = v.noloco_beta;
  c.noloco_gamma = v.noloco_gamma;
  c.noloco_group = v.noloco_group;
  c.noloco_lookahead = v.noloco_lookahead;
  c.noloco_nesterov = v.noloco_nesterov;
  c.noloco_warmup = v.noloco_warmup;
  return true;
}

bool valid_run_name(std::string_view name) {
  const auto dash = name.find('-');
  if (dash == std::string_view::npos || !parse_workload(name.substr(0, dash))) return false;
  const auto h = name.substr(dash + 1);
  return h.size() == 12 && is_hex(h);
}

}  // namespace grove::node

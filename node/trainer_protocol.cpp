#include "node/trainer_protocol.hpp"

#include <algorithm>
#include <functional>

#include "transport/crypto.hpp"
#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"

namespace grove::node {

namespace mp = transport::mp;
using transport::errc;

namespace {

constexpr std::size_t kMaxKeys = 24;
constexpr std::size_t kMaxWhy = 1024;
const char* const kDtypes[] = {"float32", "float16", "bfloat16", "float64"};

transport::Result<TrainerMessage> bad(std::string what) {
  return {errc::malformed, std::move(what)};
}

// The value under `key` in a map object, or nullptr.
const mp::Obj* field(const mp::Obj& map, std::string_view key) {
  for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR &&
        std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key)
      return &kv.val;
  }
  return nullptr;
}

// An optional finite float field: absent or nil → nullopt; false when present but not a number.
bool get_opt_float(const mp::Obj& map, std::string_view key, std::optional<float>& out) {
  const auto* v = field(map, key);
  if (!v || v->type == msgpack::type::NIL) return true;
  double d = 0;
  if (!mp::get_number(*v, d) || !std::isfinite(d) || std::abs(d) > 1e30) return false;
  out = static_cast<float>(d);
  return true;
}

bool decode_tensors(const mp::Obj& o, ModelSpec& m, std::string* why) {
  std::size_t n = 0;
  const mp::Obj* ts = mp::get_array(o, kMaxTensors, n);
  if (!ts || n == 0) {
    if (why) *why = "tensors: 1 to " + std::to_string(kMaxTensors) + " entries";
    return false;
  }
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t k = 0, d = 0;
    const mp::Obj* t = mp::get_array(ts[i], 3, k);
    TensorSpec s;
    const mp::Obj* dims = t && k == 3 ? mp::get_array(t[1], kMaxTensorDims, d) : nullptr;
    if (!dims || !mp::get_str(t[0], kMaxTensorName, s.name) || s.name.empty() ||
        !mp::get_str(t[2], 16, s.dtype)) {
      if (why) *why = "tensor " + std::to_string(i) + ": expected [name, [dims…], dtype]";
      return false;
    }
    if (std::find(std::begin(kDtypes), std::end(kDtypes), s.dtype) == std::end(kDtypes)) {
      if (why) *why = "tensor '" + s.name + "': dtype " + s.dtype + " is not a float type";
      return false;
    }
    std::uint64_t numel = 1;
    for (std::size_t j = 0; j < d; ++j) {
      std::uint64_t x = 0;
      if (!mp::get_u64(dims[j], x) || x > kMaxModelParams ||
          (x != 0 && numel > kMaxModelParams / x)) {
        if (why) *why = "tensor '" + s.name + "': bad shape";
        return false;
      }
      numel *= x;
      s.shape.push_back(x);
    }
    total += numel;
    if (total > kMaxModelParams) {
      if (why) *why = "the model has more than 2^36 parameters";
      return false;
    }
    m.tensors.push_back(std::move(s));
  }
  if (total == 0) {
    if (why) *why = "the model has no parameters";
    return false;
  }
  return true;
}

std::vector<std::uint8_t> pack_map(const std::string& op,
                                   const std::function<void(mp::Packer&)>& body = {},
                                   std::uint32_t extra = 0) {
  msgpack::sbuffer sb;
  mp::Packer p(sb);
  p.pack_map(1 + extra);
  mp::pack_str(p, "op");
  mp::pack_str(p, op);
  if (body) body(p);
  return mp::bytes_of(sb);
}

void pack_spec(mp::Packer& p, const ModelSpec& m) {
  p.pack_array(static_cast<std::uint32_t>(m.tensors.size()));
  for (const auto& t : m.tensors) {
    p.pack_array(3);
    mp::pack_str(p, t.name);
    p.pack_array(static_cast<std::uint32_t>(t.shape.size()));
    for (auto x : t.shape) p.pack_uint64(x);
    mp::pack_str(p, t.dtype);
  }
}

constexpr const char* kKinds[] = {"all_reduce", "all_gather", "barrier", "send", "recv"};

transport::Result<TrainerMessage> decode_collective(const mp::Obj& m) {
  TrainerCollective c;
  std::string kind;
  const auto* k = field(m, "kind");
  if (!k || !mp::get_str(*k, 16, kind)) return bad("collective: no kind");
  const auto at = std::find(std::begin(kKinds), std::end(kKinds), kind);
  if (at == std::end(kKinds))
    return bad("collective: kind is all_reduce, all_gather, barrier, send or recv");
  c.kind = static_cast<CollectiveKind>(at - std::begin(kKinds));
  if (const auto* v = field(m, "mean"); v && v->type != msgpack::type::NIL) {
    if (v->type != msgpack::type::BOOLEAN) return bad("collective: mean is true or false");
    c.mean = v->via.boolean;
  }
  if (const auto* v = field(m, "wire"); v && v->type != msgpack::type::NIL) {
    std::string w;
    if (!mp::get_str(*v, 8, w) || (w != "fp32" && w != "fp16"))
      return bad("collective: wire is fp32 or fp16");
    c.wire = w == "fp16" ? WireCodec::fp16 : WireCodec::fp32;
  }
  std::uint64_t u = 0;
  if (const auto* v = field(m, "n"); v && v->type != msgpack::type::NIL) {
    if (!mp::get_u64(*v, u) || u > kMaxModelParams)
      return bad("collective: n is 0 to " + std::to_string(kMaxModelParams) + " values");
    c.n = u;
  }
  if (const auto* v = field(m, "peer"); v && v->type != msgpack::type::NIL) {
    if (!mp::get_u64(*v, u) || u >= kMaxGroup)
      return bad("collective: peer is a rank below " + std::to_string(kMaxGroup));
    c.peer = static_cast<std::uint32_t>(u);
  }
  if (const auto* v = field(m, "min_size"); v && v->type != msgpack::type::NIL) {
    if (!mp::get_u64(*v, u) || u > kMaxGroup)
      return bad("collective: min_size is 0 to " + std::to_string(kMaxGroup));
    c.min_size = static_cast<std::uint32_t>(u);
  }
  if (const auto* v = field(m, "timeout"); v && v->type != msgpack::type::NIL) {
    if (!mp::get_number(*v, c.timeout_s) || !(c.timeout_s >= 0 && c.timeout_s <= 86400))
      return bad("collective: timeout is 0 to 86400 seconds");
  }
  return TrainerMessage{c};
}

}  // namespace

const char* to_string(CollectiveKind k) {
  return kKinds[static_cast<std::size_t>(k)];
}

std::uint64_t ModelSpec::params() const {
  std::uint64_t total = 0;
  for (const auto& t : tensors) {
    std::uint64_t n = 1;
    for (auto x : t.shape) n *= x;
    total += n;
  }
  return total;
}

std::string ModelSpec::hash_hex() const {
  msgpack::sbuffer sb;
  mp::Packer p(sb);
  pack_spec(p, *this);
  return transport::to_hex(
      transport::blake2b_256({reinterpret_cast<const std::uint8_t*>(sb.data()), sb.size()}));
}

transport::Result<TrainerMessage> decode_trainer_message(std::span<const std::uint8_t> body) {
  if (body.size() > kMaxTrainerFrame) return bad("message too large");
  auto oh = transport::unpack_bounded(
      body,
      {.array = kMaxTensors, .map = kMaxKeys, .str = kMaxWhy, .bin = 0, .ext = 0, .depth = 4});
  if (!oh) return bad("not a bounded msgpack value");
  const mp::Obj& m = oh->get();
  if (m.type != msgpack::type::MAP) return bad("not a map");
  std::string op;
  const auto* opv = field(m, "op");
  if (!opv || !mp::get_str(*opv, 16, op)) return bad("no op");
  if (op == "step") {
    TrainerStep s;
    const auto* loss = field(m, "loss");
    const auto* tokens = field(m, "tokens");
    const auto* eval = field(m, "eval_loss");
    if ((loss && !mp::get_number(*loss, s.loss)) || (eval && !mp::get_number(*eval, s.eval_loss)) ||
        (tokens && !mp::get_u64(*tokens, s.tokens)))
      return bad("step: loss, eval_loss and tokens are numbers");
    return TrainerMessage{s};
  }
  if (op == "stored") return TrainerMessage{TrainerStored{}};
  if (op == "saved") {
    TrainerSaved sv;
    if (const auto* why = field(m, "why"); why && why->type != msgpack::type::NIL)
      if (!mp::get_str(*why, kMaxWhy, sv.why)) return bad("saved: why is a string");
    return TrainerMessage{std::move(sv)};
  }
  if (op == "collective") return decode_collective(m);
  if (op == "buffer") {
    TrainerBuffer b;
    const auto* v = field(m, "bytes");
    if (!v || !mp::get_u64(*v, b.bytes) || b.bytes > 4 * kMaxModelParams * kMaxGroup)
      return bad("buffer: bytes is a size up to " +
                 std::to_string(4 * kMaxModelParams * kMaxGroup));
    return TrainerMessage{b};
  }
  if (op != "hello") return bad("unknown op '" + op + "'");
  TrainerHello h;
  std::uint64_t v = 0;
  const auto* ver = field(m, "version");
  if (!ver || !mp::get_u64(*ver, v) || v > 1000) return bad("hello: no version");
  h.version = static_cast<std::uint32_t>(v);
  const auto* ts = field(m, "tensors");
  std::string twhy;
  if (!ts || !decode_tensors(*ts, h.model, &twhy)) return bad("hello: " + twhy);
  if (const auto* o = field(m, "outer"); o && o->type != msgpack::type::NIL) {
    std::string s;
    if (!mp::get_str(*o, 16, s) || !RunConfig{}.set_outer(s))
      return bad("hello: outer is noloco, diloco, sparseloco or none");
    h.outer = s;
  }
  if (const auto* o = field(m, "codec"); o && o->type != msgpack::type::NIL) {
    std::string s;
    if (!mp::get_str(*o, 16, s) || !parse_codec(s))
      return bad("hello: codec is fp16, bf16, fp32 or e3m0");
    h.codec = parse_codec(s);
  }
  for (auto [key, out, most] :
       {std::tuple{"topk", &h.topk, 65536u}, std::tuple{"topk_chunk", &h.topk_chunk, 65536u},
        std::tuple{"topk_bits", &h.topk_bits, 32u}, std::tuple{"fragments", &h.fragments, 64u}})
    if (const auto* o = field(m, key); o && o->type != msgpack::type::NIL) {
      if (!mp::get_u64(*o, v) || v == 0 || v > most)
        return bad(std::string("hello: ") + key + " is 1 to " + std::to_string(most));
      *out = static_cast<std::uint32_t>(v);
    }
  for (auto [key, out, least, most] :
       {std::tuple{"outer_warmup", &h.outer_warmup, 0u, 1'000'000u},
        std::tuple{"noloco_group", &h.noloco_group, 2u, 64u},
        std::tuple{"noloco_nesterov", &h.noloco_nesterov, 0u, 1u},
        std::tuple{"noloco_warmup", &h.noloco_warmup, 0u, 1'000'000u},
        std::tuple{"overlap", &h.overlap, 0u, 1u}})
    if (const auto* o = field(m, key); o && o->type != msgpack::type::NIL) {
      if (!mp::get_u64(*o, v) || v < least || v > most)
        return bad(std::string("hello: ") + key + " is " + std::to_string(least) + " to " +
                   std::to_string(most));
      *out = static_cast<std::uint32_t>(v);
    }
  if (const auto* hs = field(m, "inner_steps"); hs && hs->type != msgpack::type::NIL) {
    if (!mp::get_u64(*hs, v) || v == 0 || v > 1'000'000)
      return bad("hello: inner_steps is 1 to 1000000");
    h.inner_steps = static_cast<std::uint32_t>(v);
  }
  if (!get_opt_float(m, "outer_lr", h.outer_lr) ||
      !get_opt_float(m, "outer_momentum", h.outer_momentum) ||
      !get_opt_float(m, "noloco_alpha", h.noloco_alpha) ||
      !get_opt_float(m, "noloco_beta", h.noloco_beta) ||
      !get_opt_float(m, "noloco_gamma", h.noloco_gamma) ||
      !get_opt_float(m, "noloco_lookahead", h.noloco_lookahead) ||
      !get_opt_float(m, "error_decay", h.error_decay))
    return bad("hello: the algorithm's numbers must be finite numbers");
  if (const auto* pid = field(m, "pid"); pid && !mp::get_u64(*pid, h.pid)) return bad("hello: pid");
  return TrainerMessage{std::move(h)};
}

std::vector<std::uint8_t> encode_trainer_message(const TrainerMessage& msg) {
  if (const auto* s = std::get_if<TrainerStep>(&msg))
    return pack_map(
        "step",
        [&](mp::Packer& p) {
          mp::pack_str(p, "loss");
          mp::pack_f64(p, s->loss);
          mp::pack_str(p, "tokens");
          p.pack_uint64(s->tokens);
          mp::pack_str(p, "eval_loss");
          mp::pack_f64(p, s->eval_loss);
        },
        3);
  if (std::holds_alternative<TrainerStored>(msg)) return pack_map("stored");
  if (const auto* b = std::get_if<TrainerBuffer>(&msg))
    return pack_map(
        "buffer",
        [&](mp::Packer& p) {
          mp::pack_str(p, "bytes");
          p.pack_uint64(b->bytes);
        },
        1);
  if (const auto* c = std::get_if<TrainerCollective>(&msg))
    return pack_map(
        "collective",
        [&](mp::Packer& p) {
          mp::pack_str(p, "kind");
          mp::pack_str(p, to_string(c->kind));
          mp::pack_str(p, "mean");
          p.pack(c->mean);
          mp::pack_str(p, "wire");
          mp::pack_str(p, c->wire == WireCodec::fp16 ? "fp16" : "fp32");
          mp::pack_str(p, "n");
          p.pack_uint64(c->n);
          mp::pack_str(p, "peer");
          p.pack_uint32(c->peer);
          mp::pack_str(p, "timeout");
          mp::pack_f64(p, c->timeout_s);
          mp::pack_str(p, "min_size");
          p.pack_uint32(c->min_size);
        },
        7);
  if (const auto* sv = std::get_if<TrainerSaved>(&msg))
    return pack_map(
        "saved",
        [&](mp::Packer& p) {
          mp::pack_str(p, "why");
          mp::pack_str(p, sv->why.substr(0, kMaxWhy));
        },
        1);
  const auto& h = std::get<TrainerHello>(msg);
  const auto opt = [](mp::Packer& p, const char* k, const std::optional<float>& v) {
    mp::pack_str(p, k);
    if (v)
      mp::pack_f64(p, *v);
    else
      p.pack_nil();
  };
  return pack_map(
      "hello",
      [&](mp::Packer& p) {
        mp::pack_str(p, "version");
        p.pack_uint32(h.version);
        mp::pack_str(p, "tensors");
        pack_spec(p, h.model);
        mp::pack_str(p, "outer");
        if (h.outer)
          mp::pack_str(p, *h.outer);
        else
          p.pack_nil();
        mp::pack_str(p, "codec");
        if (h.codec)
          mp::pack_str(p, to_string(*h.codec));
        else
          p.pack_nil();
        for (auto [key, v] :
             {std::pair{"topk", h.topk}, std::pair{"topk_chunk", h.topk_chunk},
              std::pair{"topk_bits", h.topk_bits}, std::pair{"fragments", h.fragments}}) {
          mp::pack_str(p, key);
          if (v)
            p.pack_uint32(v);
          else
            p.pack_nil();
        }
        opt(p, "error_decay", h.error_decay);
        mp::pack_str(p, "inner_steps");
        if (h.inner_steps)
          p.pack_uint32(h.inner_steps);
        else
          p.pack_nil();
        opt(p, "outer_lr", h.outer_lr);
        opt(p, "outer_momentum", h.outer_momentum);
        opt(p, "noloco_alpha", h.noloco_alpha);
        opt(p, "noloco_beta", h.noloco_beta);
        opt(p, "noloco_gamma", h.noloco_gamma);
        opt(p, "noloco_lookahead", h.noloco_lookahead);
        for (auto [key, v] :
             {std::pair{"outer_warmup", &h.outer_warmup},
              std::pair{"noloco_group", &h.noloco_group},
              std::pair{"noloco_nesterov", &h.noloco_nesterov},
              std::pair{"noloco_warmup", &h.noloco_warmup}, std::pair{"overlap", &h.overlap}}) {
          mp::pack_str(p, key);
          if (*v)
            p.pack_uint32(**v);
          else
            p.pack_nil();
        }
        mp::pack_str(p, "pid");
        p.pack_uint64(h.pid);
      },
      22);
}

void apply_hello(const TrainerHello& h, RunConfig& c) {
  c.workload = WorkloadKind::external;
  c.model = "user";
  c.model_params = h.model.params();
  c.model_tensors = static_cast<std::uint32_t>(h.model.tensors.size());
  c.model_spec = h.model.hash_hex();
  if (h.outer) c.set_outer(*h.outer);
  if (h.inner_steps) c.inner_steps = h.inner_steps;
  if (h.codec) c.codec = *h.codec;
  if (h.topk) c.topk = h.topk;
  if (h.topk_chunk) c.topk_chunk = h.topk_chunk;
  if (h.topk_bits) c.topk_bits = h.topk_bits;
  if (h.fragments) c.fragments = h.fragments;
  if (h.error_decay) c.error_decay = *h.error_decay;
  if (h.outer_lr) c.outer_lr = *h.outer_lr;
  if (h.outer_momentum) c.outer_momentum = *h.outer_momentum;
  if (h.noloco_alpha) c.noloco_alpha = *h.noloco_alpha;
  if (h.noloco_beta) c.noloco_beta = *h.noloco_beta;
  if (h.noloco_gamma) c.noloco_gamma = *h.noloco_gamma;
  if (h.noloco_lookahead) c.noloco_lookahead = *h.noloco_lookahead;
  if (h.outer_warmup) c.outer_warmup = *h.outer_warmup;
  if (h.noloco_group) c.noloco_group = *h.noloco_group;
  if (h.noloco_nesterov) c.noloco_nesterov = *h.noloco_nesterov;
  if (h.noloco_warmup) c.noloco_warmup = *h.noloco_warmup;
  if (h.overlap) c.overlap = *h.overlap;
}

std::string check_hello(const TrainerHello& h, const RunConfig& c) {
  if (h.version != kTrainerProtocol)
    return "trainer protocol version " + std::to_string(h.version) + "; this node speaks " +
           std::to_string(kTrainerProtocol) + " (use the grove package of this grove-node)";
  if (c.workload != WorkloadKind::external)
    return "run " + c.run_name() + " trains the built-in " + to_string(c.workload) +
           " workload, not a trainer's model";
  const auto params = h.model.params();
  if (params != c.model_params || h.model.tensors.size() != c.model_tensors)
    return "the model does not match the run's: " + std::to_string(h.model.tensors.size()) +
           " tensors with " + std::to_string(params) + " parameters here, " +
           std::to_string(c.model_tensors) + " tensors with " + std::to_string(c.model_params) +
           " parameters in run " + c.run_name();
  if (h.model.hash_hex() != c.model_spec)
    return "the model does not match the run's: the same sizes, but other parameter names, "
           "shapes or dtypes than in run " +
           c.run_name();
  if (h.outer && *h.outer != c.outer_name())
    return "run " + c.run_name() + " uses " + c.outer_name() + "; this trainer asked for " +
           *h.outer;
  if (h.codec && *h.codec != c.codec)
    return "run " + c.run_name() + " sends " + to_string(c.codec) + "; this trainer asked for " +
           to_string(*h.codec);
  if (h.inner_steps && h.inner_steps != c.inner_steps)
    return "run " + c.run_name() + " has " + std::to_string(c.inner_steps) +
           " inner steps per round; this trainer asked for " + std::to_string(h.inner_steps);
  if (h.overlap && *h.overlap != c.overlap)
    return "run " + c.run_name() + (c.overlap ? " overlaps" : " does not overlap") +
           " its rounds with the inner steps; this trainer asked for " +
           (*h.overlap ? "overlap" : "none");
  if (h.fragments && h.fragments != c.fragments)
    return "run " + c.run_name() + " has " + std::to_string(c.fragments) +
           " streaming fragments; this trainer asked for " + std::to_string(h.fragments);
  return {};
}

std::vector<std::uint8_t> encode_welcome(const std::string& shm, std::uint64_t bytes,
                                         const std::string& run, const RunConfig& c,
                                         const std::string& state_file) {
  return pack_map(
      "welcome",
      [&](mp::Packer& p) {
        mp::pack_str(p, "shm");
        mp::pack_str(p, shm);
        mp::pack_str(p, "bytes");
        p.pack_uint64(bytes);
        mp::pack_str(p, "run");
        mp::pack_str(p, run);
        mp::pack_str(p, "outer");
        mp::pack_str(p, to_string(c.outer));
        mp::pack_str(p, "inner_steps");
        p.pack_uint32(c.inner_steps);
        mp::pack_str(p, "fragments");
        p.pack_uint32(c.fragments);
        mp::pack_str(p, "state_file");
        mp::pack_str(p, state_file);
      },
      7);
}

std::vector<std::uint8_t> encode_refused(const std::string& why) {
  return pack_map(
      "refused",
      [&](mp::Packer& p) {
        mp::pack_str(p, "why");
        mp::pack_str(p, why.substr(0, kMaxWhy));
      },
      1);
}

std::vector<std::uint8_t> encode_store() {
  return pack_map("store");
}

std::vector<std::uint8_t> encode_save() {
  return pack_map("save");
}

std::vector<std::uint8_t> encode_go(bool load, std::size_t lo, std::optional<std::size_t> hi) {
  const bool part = load && hi;
  return pack_map(
      "go",
      [&](mp::Packer& p) {
        mp::pack_str(p, "load");
        p.pack(load);
        if (!part) return;
        mp::pack_str(p, "lo");
        p.pack_uint64(lo);
        mp::pack_str(p, "hi");
        p.pack_uint64(*hi);
      },
      part ? 3 : 1);
}

std::vector<std::uint8_t> encode_bye(const std::string& why) {
  return pack_map(
      "bye",
      [&](mp::Packer& p) {
        mp::pack_str(p, "why");
        mp::pack_str(p, why.substr(0, kMaxWhy));
      },
      1);
}

std::vector<std::uint8_t> encode_collective_done(bool ok, const std::string& why,
                                                 std::uint64_t call, std::uint32_t rank,
                                                 std::uint32_t size, std::uint64_t n,
                                                 std::uint64_t at, bool joined) {
  return pack_map(
      "done",
      [&](mp::Packer& p) {
        mp::pack_str(p, "ok");
        p.pack(ok);
        mp::pack_str(p, "why");
        mp::pack_str(p, why.substr(0, kMaxWhy));
        mp::pack_str(p, "call");
        p.pack_uint64(call);
        mp::pack_str(p, "rank");
        p.pack_uint32(rank);
        mp::pack_str(p, "size");
        p.pack_uint32(size);
        mp::pack_str(p, "n");
        p.pack_uint64(n);
        mp::pack_str(p, "at");
        p.pack_uint64(at);
        mp::pack_str(p, "joined");
        p.pack(joined);
      },
      8);
}

std::vector<std::uint8_t> encode_segment(const std::string& shm, std::uint64_t bytes) {
  return pack_map(
      "segment",
      [&](mp::Packer& p) {
        mp::pack_str(p, "shm");
        mp::pack_str(p, shm);
        mp::pack_str(p, "bytes");
        p.pack_uint64(bytes);
      },
      2);
}

}  // namespace grove::node

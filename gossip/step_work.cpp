#include "gossip/step_work.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "gossip/state_delta.hpp"
#include "optim/codecs.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

Digest weights_hash(std::span<const float> phi) {
  return transport::blake2b_256(
      {reinterpret_cast<const std::uint8_t*>(phi.data()), phi.size_bytes()});
}

Digest weights_hash(const optim::Floats& phi) {
  transport::Blake2b256 h;
  optim::by_fragments(phi.size(),
                      [&](std::size_t lo, std::size_t hi) {
                        h.update({reinterpret_cast<const std::uint8_t*>(phi.data() + lo),
                                  (hi - lo) * sizeof(float)});
                      },
                      {&phi});
  return h.final();
}

optim::Floats pseudo_gradient_into(const optim::Floats& phi, const optim::Floats& theta,
                                   std::size_t offset, optim::Floats into,
                                   const optim::FloatAllocator& alloc, unsigned threads,
                                   float scale, Slice slice) {
  const std::size_t a = slice.lo, b = slice.end(phi.size());
  if (into.size() < offset + (b - a)) into = optim::Floats::zeros(offset + (b - a), alloc);
  optim::by_fragments(a, b,
                      [&](std::size_t lo, std::size_t hi) {
                        optim::pseudo_gradient(std::span(phi.data() + lo, hi - lo),
                                               std::span(theta.data() + lo, hi - lo),
                                               std::span(into.data() + offset + lo - a, hi - lo),
                                               threads, scale);
                        into.release(offset + lo - a, offset + hi - a);
                      },
                      {&phi, &theta});
  return into;
}

std::pair<optim::Floats, optim::Floats> noloco_proposal_into(const optim::Floats& phi,
                                                             const optim::Floats& m,
                                                             const optim::Floats& theta,
                                                             const optim::NoLoCoConfig& cfg,
                                                             const optim::FloatAllocator& alloc,
                                                             unsigned threads, Slice slice) {
  const std::size_t a = slice.lo, b = slice.end(phi.size());
  auto p = optim::Floats::zeros(b - a, alloc), mn = optim::Floats::zeros(b - a, alloc);
  optim::by_fragments(a, b,
                      [&](std::size_t lo, std::size_t hi) {
                        optim::noloco_proposal(
                            std::span(phi.data() + lo, hi - lo), std::span(m.data() + lo, hi - lo),
                            std::span(theta.data() + lo, hi - lo),
                            std::span(p.data() + lo - a, hi - lo),
                            std::span(mn.data() + lo - a, hi - lo), cfg, threads);
                        p.release(lo - a, hi - a);
                        mn.release(lo - a, hi - a);
                      },
                      {&phi, &m, &theta});
  return {std::move(p), std::move(mn)};
}

double pseudo_gradient_norm(const optim::Floats& phi, const optim::Floats& theta, unsigned threads,
                            Slice slice) {
  double sum = 0.0;
  optim::by_fragments(slice.lo, slice.end(phi.size()),
                      [&](std::size_t lo, std::size_t hi) {
                        sum += optim::pseudo_gradient_sq_norm(std::span(phi.data() + lo, hi - lo),
                                                              std::span(theta.data() + lo, hi - lo),
                                                              threads);
                      },
                      {&phi, &theta});
  return std::sqrt(sum);
}

double accumulate_error(const optim::Floats& phi, const optim::Floats& theta, optim::Floats& e,
                        float decay, float scale, const optim::FloatAllocator& alloc,
                        unsigned threads, Slice slice, double* fresh) {
  if (e.size() != phi.size()) e = optim::Floats::zeros(phi.size(), alloc);
  double sum = 0.0, fresh_sum = 0.0;
  std::vector<float> d(std::min(slice.size(phi.size()), optim::kFragment));
  optim::by_fragments(slice.lo, slice.end(phi.size()),
                      [&](std::size_t lo, std::size_t hi) {
                        const auto delta = std::span(d).first(hi - lo);
                        const auto part = std::span(e.data() + lo, hi - lo);
                        optim::pseudo_gradient(std::span(phi.data() + lo, hi - lo),
                                               std::span(theta.data() + lo, hi - lo), delta,
                                               threads, scale);
                        if (fresh) {
                          const double f = optim::l2_norm(delta.data(), delta.size());
                          fresh_sum += f * f;
                        }
                        optim::error_feedback_accumulate(part, delta, decay, threads);
                        const double x = optim::l2_norm(part.data(), part.size());
                        sum += x * x;
                      },
                      {&phi, &theta, &e});
  if (fresh) *fresh = std::sqrt(fresh_sum);
  return std::sqrt(sum);
}

double norm_of(const optim::Floats& values, std::size_t offset, std::size_t n) {
  double sum = 0.0;
  optim::by_fragments(n,
                      [&](std::size_t lo, std::size_t hi) {
                        const double x = optim::l2_norm(values.data() + offset + lo, hi - lo);
                        sum += x * x;
                        values.release(offset + lo, offset + hi);
                      },
                      {});
  return std::sqrt(sum);
}

void copy_values(const optim::Floats& from, std::size_t from_lo, optim::Floats& into,
                 std::size_t into_lo, std::size_t count) {
  optim::by_fragments(from_lo, from_lo + count,
                      [&](std::size_t a, std::size_t b) {
                        std::copy(from.begin() + a, from.begin() + b,
                                  into.begin() + (into_lo + a - from_lo));
                        into.release(into_lo + a - from_lo, into_lo + b - from_lo);
                      },
                      {&from});
}

optim::Floats copy_range(const optim::Floats& from, std::size_t lo, std::size_t hi,
                         const optim::FloatAllocator& alloc, std::size_t size) {
  auto into = optim::Floats::zeros(std::max(size, hi - lo), alloc);
  copy_values(from, lo, into, 0, hi - lo);
  return into;
}

namespace {
template <class A>
auto part(A& a, std::size_t lo, std::size_t hi) {
  return std::span(a.data() + lo, hi - lo);
}
}  // namespace

void StepWork::run() {
  // A failure's reason in words (the code's own text when it has none).
  const auto reason = [](const auto& r) { return r.why().empty() ? r.text() : r.why(); };
  bool hashed = false;  // `hash` is already φ's (the delta's seal, the replay's check)
  auto& phi = state.phi;
  auto& m = state.momentum;
  const std::size_t n = phi.size();
  // Scratch of one fragment (Δ, or φ before the step) for the steps that need one.
  std::vector<float> scratch, scratch2;
  auto& e = state.error;
  // DiLoCo's step for the round it ends (its outer warm-up: optim::DiLoCoConfig::at_round).
  const optim::DiLoCoConfig dl = diloco.at_round(state.round);
  // NoLoCo's likewise (its warm-up, when the run has one).
  const optim::NoLoCoConfig nl = noloco.at_round(state.round);
  const bool flush = kind == Kind::local && mode == OuterMode::diloco && compressed &&
                     error_has_delta && e.size() == n;
  // The values a DiLoCo round steps: [sa, sb) (a streaming fragment, or all of them).
  const std::size_t sa = std::min(slice.lo, n), sb = std::clamp(slice.end(n), sa, n);
  const auto frag = [&](std::vector<float>& v, std::size_t len) {
    if (v.size() < len) v.resize(std::min(n, optim::kFragment));
    return std::span(v).first(len);
  };
  // NoLoCo's local-only step over [a, b): the mean is ours (θ, or Δ and φ); with the Nesterov
  // rule no outer step at all, as a member alone (Kind::local): its own Nesterov step would
  // extrapolate one member's pseudo-gradient.
  const auto noloco_local = [&](std::size_t a, std::size_t b) {
    optim::by_fragments(
        a, b,
        [&](std::size_t lo, std::size_t hi) {
          if (nl.one_tensor()) {
            optim::noloco_step_theta(part(phi, lo, hi), part(m, lo, hi), part(theta, lo, hi), nl,
                                     threads);
            return;
          }
          if (nl.nesterov) {  // as a member alone: φ = θ, the momentum fades
            std::copy(theta.begin() + lo, theta.begin() + hi, phi.begin() + lo);
            for (float& v : part(m, lo, hi)) v *= nl.alpha;
            return;
          }
          auto d = frag(scratch, hi - lo);
          optim::pseudo_gradient(part(phi, lo, hi), part(theta, lo, hi), d, threads);
          auto phi0 = frag(scratch2, hi - lo);
          std::copy(phi.begin() + lo, phi.begin() + hi, phi0.begin());
          optim::noloco_step(part(phi, lo, hi), part(m, lo, hi), d, phi0, nl, threads);
        },
        {&phi, &m, &theta});
  };
  switch (kind) {
    case Kind::prepare:
      norm = compressed ? accumulate_error(phi, theta, state.error, compressed->decay, 1.0f, alloc,
                                           threads, {sa, sb}, &fresh_norm)
                        : pseudo_gradient_norm(phi, theta, threads, {sa, sb});
      blob = nullptr;
      return;  // (no step, no hash, no snapshot)
    case Kind::none:
      break;
    case Kind::save:
      hashed = true;
      break;
    case Kind::local:
      // Alone (no group formed, or nobody completed the exchange): the inner phase's progress as
      // it is, as one trainer alone would keep it: φ = θ, no outer step (an outer step on one
      // member's pseudo-gradient extrapolates it: docs/ALGORITHMS.md). NoLoCo's momentum decays
      // as if the round had added nothing (a look-ahead start then fades out); DiLoCo's stays
      // (the group's, for when it meets again). A lone member of compressed rounds applies its
      // whole error buffer, what it has not sent of this phase and the earlier ones: φ −= e.
      optim::by_fragments(mode == OuterMode::noloco ? 0 : sa, mode == OuterMode::noloco ? n : sb,
                          [&](std::size_t lo, std::size_t hi) {
                            if (flush) {
                              auto p = part(phi, lo, hi);
                              for (std::size_t i = 0; i < p.size(); ++i) p[i] -= e[lo + i];
                              std::fill(e.begin() + lo, e.begin() + hi, 0.0f);
                              return;
                            }
                            std::copy(theta.begin() + lo, theta.begin() + hi, phi.begin() + lo);
                            if (mode == OuterMode::noloco)
                              for (float& v : part(m, lo, hi)) v *= nl.alpha;
                          },
                          {&phi, &m, &theta, &e});
      break;
    case Kind::noloco_mean: {
      // With a slice (fragments): the pair's means over [sa, sb), ours elsewhere.
      const bool sliced = !slice.whole(n);
      if (sliced && (mean.size() != sb - sa || (!nl.one_tensor() && phi_mean.size() != sb - sa) ||
                     theta.size() != n)) {
        error = "the pair's mean has " + std::to_string(mean.size()) + " values, not " +
                std::to_string(sb - sa);
        break;
      }
      if (sliced && nl.one_tensor()) {  // θ with the pair's mean over the slice: one step
        copy_values(mean, 0, theta, sa, sb - sa);
        mean = {};
      }
      if (nl.nesterov) {
        // The group's means of P and m' become φ and m over [sa, sb) (`theta`, or with a slice
        // `mean`, and `phi_mean` hold them); outside a slice the values keep our θ.
        const auto& p_mean = sliced ? mean : theta;
        if (!sliced && (theta.size() != n || phi_mean.size() != n)) {
          error = "the pair's means have " + std::to_string(theta.size()) + " and " +
                  std::to_string(phi_mean.size()) + " values, not " + std::to_string(n);
          break;
        }
        noloco_local(0, sa);
        copy_values(p_mean, 0, phi, sa, sb - sa);
        copy_values(phi_mean, 0, m, sa, sb - sa);
        noloco_local(sb, n);
        phi_mean = {};
        mean = {};
        break;
      }
      if (!sliced || nl.one_tensor()) {
        optim::by_fragments(n,
                            [&](std::size_t lo, std::size_t hi) {
                              if (nl.one_tensor())
                                optim::noloco_step_theta(part(phi, lo, hi), part(m, lo, hi),
                                                         part(theta, lo, hi), nl, threads);
                              else
                                optim::noloco_step(part(phi, lo, hi), part(m, lo, hi),
                                                   part(theta, lo, hi), part(phi_mean, lo, hi), nl,
                                                   threads);
                            },
                            {&phi, &m, &theta, &phi_mean});
        break;
      }
      // β ≠ γ with a slice: the means of Δ and φ over it, the local-only step around it.
      noloco_local(0, sa);
      optim::by_fragments(sa, sb,
                          [&](std::size_t lo, std::size_t hi) {
                            optim::noloco_step(part(phi, lo, hi), part(m, lo, hi),
                                               part(mean, lo - sa, hi - sa),
                                               part(phi_mean, lo - sa, hi - sa), nl, threads);
                            mean.release(lo - sa, hi - sa);
                            phi_mean.release(lo - sa, hi - sa);
                          },
                          {&phi, &m});
      noloco_local(sb, n);
      break;
    }
    case Kind::parse: {
      auto s = blob ? load_state(*blob, max_values, alloc) : std::nullopt;
      if (!s) {
        blob = nullptr;
        error = "the downloaded state does not parse";
        return;
      }
      if (want && s->phi.size() != *want) {
        blob = nullptr;
        error = "the downloaded state has " + std::to_string(s->phi.size()) + " values, we need " +
                std::to_string(*want);
        return;
      }
      state = std::move(*s);
      if (state.momentum.size() != state.phi.size()) {
        state.momentum = optim::Floats::zeros(state.phi.size(), alloc);
        blob = nullptr;  // no longer this state's form: written anew below
      }
      break;  // (else the download is served as it is: the state's own form)
    }
    case Kind::diloco_ring: {
      // The result is mean Δ, or mean φ ‖ mean Δ (members entered from NoLoCo: one φ, one
      // momentum (zero) and one round for the group).
      // Mean Δ alone covers [sa, sb) (ring[i] is value sa + i); mean φ ‖ mean Δ all of φ.
      const std::size_t lo0 = average_phi ? 0 : sa, hi0 = average_phi ? n : sb;
      const std::size_t d = average_phi ? n : 0;
      if (ring.size() != d + (hi0 - lo0)) {
        error = "the round's result has " + std::to_string(ring.size()) + " values, not " +
                std::to_string(d + (hi0 - lo0));
        ring.release();
        break;
      }
      if (!average_phi && std::isfinite(max_mean_norm)) {
        // A member that declared a smaller ‖Δ‖ than it sent shows here: the triangle inequality
        // bounds ‖mean Δ‖ by the mean of the members' norms.
        if (const double got = norm_of(ring, d, hi0 - lo0); !(got <= max_mean_norm)) {
          dropped = "the mean pseudo-gradient's norm " + fmt::format("{:.6g}", got) + " is above " +
                    fmt::format("{:.6g}", max_mean_norm) +
                    ", the mean of the norms the members declared (a member sent more than it "
                    "declared): the round's step is not taken, slow weights unchanged";
          ring.release();
          if (error_is_residual && e.size() == n)
            optim::by_fragments(lo0, hi0,
                                [&](std::size_t lo, std::size_t hi) {
                                  std::fill(e.begin() + lo, e.begin() + hi, 0.0f);
                                },
                                {&e});
          break;
        }
      }
      // Mean Δ alone is also kept as the round's delta (a member behind replays it).
      std::optional<DeltaWriter> out;
      if (delta_store && !average_phi) {
        if (auto w = DeltaWriter::create(*delta_store, delta_codec, n, {lo0, hi0}))
          out.emplace(std::move(*w));
        else
          spdlog::warn("cannot keep the delta of round {}: {}", state.round, w.text());
      }
      // Compressed rounds: what this member sent leaves its error buffer (it is now in φ
      // through the mean).
      if (compressed && e.size() != n) {
        error = "no error buffer for a compressed round";
        ring.release();
        break;
      }
      // (Fragments start at lo0: the feedback's pieces line up with the all-gather's.)
      optim::by_fragments(
          lo0, hi0,
          [&](std::size_t lo, std::size_t hi) {
            if (compressed &&
                compressed->codec.feedback(part(e, lo, hi), compressed->piece_values) !=
                    optim::CodecError::ok)
              spdlog::error("round {}: our error buffer is not finite", state.round);
            if (error_is_residual && error_scale != 1.0f && e.size() == n)
              for (float& v : part(e, lo, hi)) v *= error_scale;
            if (average_phi) {
              std::copy(ring.begin() + lo, ring.begin() + hi, phi.begin() + lo);
              std::fill(m.begin() + lo, m.begin() + hi, 0.0f);
              ring.release(lo, hi);
            }
            const std::size_t r0 = d + lo - lo0, r1 = d + hi - lo0;  // in `ring`
            if (out)
              if (auto r = out->write(lo - lo0, part(ring, r0, r1)); !r) {
                spdlog::warn("cannot keep the delta of round {}: {}", state.round, reason(r));
                out.reset();
              }
            optim::diloco_step(part(phi, lo, hi), part(m, lo, hi), part(ring, r0, r1), dl, threads);
            ring.release(r0, r1);
          },
          {&phi, &m, &e});
      if (out) {
        hash = weights_hash(phi);
        hashed = true;
        if (auto b = out->seal(state.round, delta_from, hash))
          delta = std::move(*b);
        else
          spdlog::warn("cannot keep the delta of round {}: {}", state.round, b.text());
      }
      break;
    }
    case Kind::replay:
      for (const auto& b : deltas) {
        const auto before = state.round;
        if (auto r = replay_delta(*b, state, hash, diloco, threads); !r) {
          damaged = r.error() == transport::make_error_code(transport::errc::source_failed);
          error =
              "the delta of round " + std::to_string(before + 1) + " does not replay: " + reason(r);
          blob = nullptr;
          return;
        }
      }
      hashed = true;
      break;
  }
  phi_mean = {};
  mean = {};
  if (!hashed) hash = weights_hash(phi);
  if (!store) {
    blob = nullptr;
    return;
  }
  if (blob) return;
  // A member's error buffer is its own (what it has yet to send): snapshots served to joiners
  // and written into checkpoints leave it out.
  optim::Floats own_error = std::exchange(state.error, {});
  auto b = save_state(*store, state);
  state.error = std::move(own_error);
  if (b)
    blob = std::move(*b);
  else
    spdlog::warn("cannot keep the snapshot of round {} (joiners will not get it from us): {}",
                 state.round, b.text());
}

}  // namespace grove::gossip

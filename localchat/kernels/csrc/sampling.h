// One token per row of logits (float32, CPU): greedy, or temperature, top-k, top-p and min-p followed by the
// two-level exponential race of engine/sampling/sampler.py, whose torch code is the reference this must match.
//
// The torch reference costs about 0.5 ms per row in the engine (a dozen vocabulary-sized temporaries and a
// top-k); here a row is two vectorized passes over the vocabulary (the maximum, then the weights
// exp((l - max) / T) with their sum, keeping the ids of the likely ones) and work on those few candidates:
// - a candidate is a token whose weight is at least kCandidateFloor (its probability over the most likely
//   token's). Top-k and top-p only need the candidates when there are at least k of them, or when they hold
//   at least top_p of the mass; otherwise every token is a candidate, so the result is exact either way;
// - the candidates are bucketed by their weight's top float bits (a bucket spans a factor of at most
//   2^(1/8), and bucket order is value order), so only the bucket where the top-k count or the top-p mass
//   runs out is sorted.
// A token is kept by top-p when the mass of the tokens ranked before it is below top_p (after top-k, over
// the top k), and by min-p when its weight is at least min_p times the most likely token's.
#pragma once
#include "torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "quant/sampling.h"

namespace sampling {

constexpr int64_t kRaceGroup = 256;               // token ids per group of the race (sampler.RACE_GROUP)
constexpr float kCandidateFloor = 9.5367431640625e-07f;  // 2^-20
constexpr int kBuckets = 1024;                    // bucket_of(w) for 0 <= w <= 1 is below 1017

inline int bucket_of(float weight) {
  uint32_t bits;
  std::memcpy(&bits, &weight, sizeof bits);
  return static_cast<int>(bits >> 20);
}

struct RowParams {
  float inv_temperature;  // 0: greedy
  int64_t top_k;          // vocab or more: off
  float top_p;            // 1: off
  float min_p;            // 0: off
};

// Per-thread buffers, grown once and reused from row to row and step to step.
struct Scratch {
  std::vector<float> weights;
  std::vector<int32_t> ids;
  std::vector<std::pair<float, int32_t>> kept;  // (weight, id)
  std::vector<float> group_sums;
  std::vector<double> bucket_mass;
  std::vector<int64_t> bucket_count;
};

inline Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The row's two vectorized passes, this build's ISA's (quant/sampling.h): the index of the first largest logit, and
// the weights exp((l - max) / T) with their sum and the ids of those at least a floor.
using sampling_rows::argmax;
using sampling_rows::weigh;

inline bool heavier(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// The kept (weight, id) of a row with top-k and/or top-p, from its candidates ids[0, count); min-p is
// applied by the caller. `total` is the sum of every weight of the row.
inline void filter_candidates(Scratch& s, const float* w, int64_t count, double total, const RowParams& p,
                              int64_t vocab) {
  const bool by_k = p.top_k < vocab;
  auto& kept = s.kept;
  kept.clear();
  s.bucket_mass.assign(kBuckets, 0.0);
  s.bucket_count.assign(kBuckets, 0);
  for (int64_t j = 0; j < count; ++j) {
    const float weight = w[s.ids[j]];
    const int b = bucket_of(weight);
    s.bucket_mass[b] += weight;
    s.bucket_count[b] += 1;
  }
  if (by_k) {
    // the buckets holding the top k, then the k heaviest of them in order
    int boundary = kBuckets - 1;
    for (int64_t seen = 0; boundary > 0; --boundary)
      if ((seen += s.bucket_count[boundary]) >= p.top_k) break;
    for (int64_t j = 0; j < count; ++j) {
      const float weight = w[s.ids[j]];
      if (bucket_of(weight) > boundary) kept.emplace_back(weight, s.ids[j]);
    }
    const size_t whole = kept.size();
    for (int64_t j = 0; j < count; ++j) {
      const float weight = w[s.ids[j]];
      if (bucket_of(weight) == boundary) kept.emplace_back(weight, s.ids[j]);
    }
    const auto k = static_cast<std::ptrdiff_t>(std::min<size_t>(p.top_k, kept.size()));
    if (p.top_p >= 1.f) {  // the set is enough: pick the rest of the k from the boundary bucket
      std::nth_element(kept.begin() + whole, kept.begin() + k, kept.end(), heavier);
      kept.resize(k);
      return;
    }
    std::partial_sort(kept.begin(), kept.begin() + k, kept.end(), heavier);
    kept.resize(k);
    double mass = 0.0;
    for (const auto& entry : kept) mass += entry.first;
    const double limit = static_cast<double>(p.top_p) * mass;
    double before = 0.0;
    size_t keep = 0;
    while (keep < kept.size() && (keep == 0 || before < limit)) before += kept[keep++].first;
    kept.resize(keep);
    return;
  }
  // top-p alone: every bucket above the one where the mass reaches top_p is kept whole
  const double limit = static_cast<double>(p.top_p) * total;
  int boundary = kBuckets - 1;
  double above = 0.0;
  for (; boundary > 0; --boundary) {
    if (above + s.bucket_mass[boundary] >= limit) break;
    above += s.bucket_mass[boundary];
  }
  for (int64_t j = 0; j < count; ++j) {
    const float weight = w[s.ids[j]];
    const int b = bucket_of(weight);
    if (b > boundary) kept.emplace_back(weight, s.ids[j]);
  }
  const size_t first_boundary = kept.size();
  for (int64_t j = 0; j < count; ++j) {
    const float weight = w[s.ids[j]];
    if (bucket_of(weight) == boundary) kept.emplace_back(weight, s.ids[j]);
  }
  std::sort(kept.begin() + first_boundary, kept.end(), heavier);
  double before = above;
  size_t keep = first_boundary;
  while (keep < kept.size() && (keep == 0 || before < limit)) before += kept[keep++].first;
  kept.resize(keep);
}

// The race of sampler._race over the kept tokens: the group of RACE_GROUP ids with the largest total weight
// over its noise, then the member with the largest weight over its own.
inline int64_t race_kept(Scratch& s, int64_t vocab, const float* noise) {
  const int64_t groups = (vocab + kRaceGroup - 1) / kRaceGroup;
  s.group_sums.assign(groups, 0.f);
  for (const auto& [weight, id] : s.kept) s.group_sums[id / kRaceGroup] += weight;
  int64_t group = 0;
  float best = -1.f;
  for (int64_t g = 0; g < groups; ++g) {
    const float score = s.group_sums[g] / noise[g];
    if (score > best) best = score, group = g;
  }
  int64_t token = group * kRaceGroup;
  best = -1.f;
  for (const auto& [weight, id] : s.kept) {
    if (id / kRaceGroup != group) continue;
    const float score = weight / noise[groups + id % kRaceGroup];
    if (score > best || (score == best && id < token)) best = score, token = id;
  }
  return token;
}

// The same race over every token's weight (rows without top-k and top-p).
inline int64_t race_all(const float* w, int64_t vocab, const float* noise) {
  const int64_t groups = (vocab + kRaceGroup - 1) / kRaceGroup;
  int64_t group = 0;
  float best = -1.f;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t end = std::min(vocab, (g + 1) * kRaceGroup);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = g * kRaceGroup; i < end; ++i) sum += w[i];
    const float score = sum / noise[g];
    if (score > best) best = score, group = g;
  }
  const int64_t begin = group * kRaceGroup, end = std::min(vocab, begin + kRaceGroup);
  int64_t token = begin;
  best = -1.f;
  for (int64_t i = begin; i < end; ++i) {
    const float score = w[i] / noise[groups + i - begin];
    if (score > best) best = score, token = i;
  }
  return token;
}

inline int64_t sample_row(const float* logits, int64_t vocab, const RowParams& p, const float* noise) {
  const int64_t top = argmax(logits, vocab);
  if (p.inv_temperature == 0.f) return top;
  Scratch& s = scratch();
  if (static_cast<int64_t>(s.weights.size()) < vocab) s.weights.resize(vocab), s.ids.resize(vocab);
  float* w = s.weights.data();
  const bool by_k = p.top_k < vocab, by_p = p.top_p < 1.f;
  int64_t count = 0;
  const double total = weigh(logits, vocab, logits[top], p.inv_temperature,
                             by_k || by_p ? kCandidateFloor : std::numeric_limits<float>::infinity(), w,
                             s.ids.data(), count);
  if (!by_k && !by_p) {
    if (p.min_p > 0.f)
      for (int64_t i = 0; i < vocab; ++i) w[i] = w[i] < p.min_p ? 0.f : w[i];
    return race_all(w, vocab, noise);
  }
  // too few candidates for top-k, or too little of their mass for top-p: every token is one
  bool enough = !by_k || count >= p.top_k;
  if (!by_k) {
    double mass = 0.0;
    for (int64_t j = 0; j < count; ++j) mass += w[s.ids[j]];
    enough = mass >= static_cast<double>(p.top_p) * total;
  }
  if (!enough) {
    for (int64_t i = 0; i < vocab; ++i) s.ids[i] = static_cast<int32_t>(i);
    count = vocab;
  }
  filter_candidates(s, w, count, total, p, vocab);
  if (p.min_p > 0.f) {
    // the heaviest kept token has weight 1 (it is the argmax)
    auto& kept = s.kept;
    kept.erase(std::remove_if(kept.begin(), kept.end(), [&](const auto& e) { return e.first < p.min_p; }),
               kept.end());
  }
  return race_kept(s, vocab, noise);
}

}  // namespace sampling

// tokens[B] (int64) for logits [B, vocab] and per-row temperature [B] (0: greedy), top_k [B] (int64, vocab:
// off), top_p [B], min_p [B] (each optional) and race noise [B, groups + 256] of Exp(1) draws.
torch::Tensor sample_tokens(const torch::Tensor& logits, const torch::Tensor& temperature,
                            const c10::optional<torch::Tensor>& top_k, const c10::optional<torch::Tensor>& top_p,
                            const c10::optional<torch::Tensor>& min_p, const torch::Tensor& noise) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat && logits.is_contiguous(),
              "sample_tokens: contiguous float32 [rows, vocab] logits");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const int64_t groups = (vocab + sampling::kRaceGroup - 1) / sampling::kRaceGroup;
  TORCH_CHECK(vocab < (int64_t{1} << 31), "sample_tokens: vocabulary too large");
  TORCH_CHECK(noise.scalar_type() == torch::kFloat && noise.is_contiguous() && noise.dim() == 2 &&
                  noise.size(0) == rows && noise.size(1) == groups + sampling::kRaceGroup,
              "sample_tokens: noise must be float32 [rows, groups + 256]");
  auto column = [&](const c10::optional<torch::Tensor>& t, torch::ScalarType type) -> torch::Tensor {
    if (!t.has_value() || !t->defined()) return torch::Tensor();
    TORCH_CHECK(t->numel() == rows, "sample_tokens: one parameter per row");
    return t->to(type).contiguous();
  };
  const torch::Tensor temps = temperature.to(torch::kFloat).contiguous();
  TORCH_CHECK(temps.numel() == rows, "sample_tokens: one temperature per row");
  const torch::Tensor ks = column(top_k, torch::kLong), ps = column(top_p, torch::kFloat),
                      mins = column(min_p, torch::kFloat);
  torch::Tensor tokens = torch::empty({rows}, torch::kLong);
  const float* lp = logits.data_ptr<float>();
  const float* np = noise.data_ptr<float>();
  int64_t* out = tokens.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float t = temps.data_ptr<float>()[r];
      const sampling::RowParams params{
          t > 0.f ? 1.f / t : 0.f,
          ks.defined() ? ks.data_ptr<int64_t>()[r] : vocab,
          ps.defined() ? ps.data_ptr<float>()[r] : 1.f,
          mins.defined() ? mins.data_ptr<float>()[r] : 0.f,
      };
      out[r] = sampling::sample_row(lp + r * vocab, vocab, params, np + r * (groups + sampling::kRaceGroup));
    }
  });
  return tokens;
}

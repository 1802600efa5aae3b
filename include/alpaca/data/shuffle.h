// Hugging Face datasets' Dataset.shuffle(seed): the rows in the order of
// np.random.default_rng(seed).permutation(len) — NumPy's SeedSequence, PCG64 (XSL-RR 128/64) and
// Generator.shuffle's Fisher-Yates over random_interval (masked rejection), reproduced so TRL's
// --shuffle_dataset orders the rows as TRL does (trl SFTTrainer._prepare_dataset shuffles with
// args.seed before packing and after). Light: no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace alpaca::data {

// np.random.default_rng(seed).permutation(n), as int64 indices.
std::vector<int64_t> numpy_permutation(uint64_t seed, int64_t n);

// Dataset.shuffle(seed=seed) of `rows`: a new vector, rows[perm[0]], rows[perm[1]], ...
template <class T>
std::vector<T> datasets_shuffle(const std::vector<T>& rows, uint64_t seed) {
  std::vector<T> out;
  out.reserve(rows.size());
  for (int64_t i : numpy_permutation(seed, static_cast<int64_t>(rows.size()))) out.push_back(rows[static_cast<size_t>(i)]);
  return out;
}

}  // namespace alpaca::data

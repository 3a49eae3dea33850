// A small deterministic PRNG (splitmix64 seeding xoshiro256**): the same numbers on every
// platform and standard library, unlike std::uniform_*_distribution.
#pragma once

#include <cstdint>
#include <vector>

namespace headroom {

// splitmix64 step: mixes a seed (and, chained, several values) into 64 well-spread bits.
uint64_t mix_seed(uint64_t x);

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();                            // [0, 1)
  double uniform(double lo, double hi);        // [lo, hi)
  int64_t integer(int64_t lo, int64_t hi);     // [lo, hi], unbiased
  bool chance(double p) { return uniform() < p; }

 private:
  uint64_t s_[4];
};

// A permutation of 0..n-1 (Fisher-Yates with Rng).
std::vector<int64_t> permutation(int64_t n, Rng& rng);

}  // namespace headroom

/*
 * sampler_int.h - the sampler's random generator (src/text/sampler.c), exposed
 * so that tests/test_sampler.c can pin its outputs: a change to the generator
 * changes every sampled sequence, so it must never happen silently.
 *
 * The generator is xoshiro256** (Blackman and Vigna, 2018), its four words of
 * state filled by four successive outputs of splitmix64 started at the seed.
 * A uniform double in [0, 1) is the top 53 bits of one output times 2^-53.
 * Integer arithmetic only (the double is exact), so a seed gives the same
 * numbers on every machine.
 */
#ifndef TIDE_SAMPLER_INT_H
#define TIDE_SAMPLER_INT_H

#include <stdint.h>

typedef struct sampler_rng {
    uint64_t s[4];
} sampler_rng;

/* The state for a seed: s[i] = the (i+1)th output of splitmix64 from seed. */
void sampler_rng_seed(sampler_rng *r, uint64_t seed);
/* The next raw 64-bit output of xoshiro256**. */
uint64_t sampler_rng_next(sampler_rng *r);
/* (sampler_rng_next(r) >> 11) * 2^-53: a double in [0, 1). */
double sampler_rng_uniform(sampler_rng *r);

#endif

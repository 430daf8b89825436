/*
 * pool_int.h - what the pool's tests may see beyond tide.h: a hook told of
 * every change of the shares in use, so that a test can check the budget at
 * each instant rather than at the end.
 */
#ifndef TIDE_SERVE_POOL_INT_H
#define TIDE_SERVE_POOL_INT_H

#include "tide.h"

/* Called with the pool's lock held after every change of the sum of the
 * shares in use (held_bytes), with that sum and the whole budget. It must not
 * call the pool. fn NULL removes the hook. */
typedef void (*tide_pool_held_hook)(void *user, uint64_t held_bytes, uint64_t budget_bytes);
void tide_pool_set_held_hook(tide_pool *p, tide_pool_held_hook fn, void *user);

#endif

/*
 * alloc_test.h - fault injection for the allocation hooks (tests only).
 */
#ifndef TIDE_ALLOC_TEST_H
#define TIDE_ALLOC_TEST_H

#include <stdint.h>

/* Makes the nth allocation from now fail (1 = the next one); 0 disables. */
void tide_alloc_fail_nth(long n);
/* Number of allocations made since the process started. */
long tide_alloc_count(void);
/* Bytes currently allocated through the hooks (aligned allocations included). */
int64_t tide_alloc_live_bytes(void);

#endif

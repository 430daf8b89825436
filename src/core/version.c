/*
 * version.c - the library's version string (tide_version), the numbers of
 * include/tide.h as they were when this library was built.
 */
#include "tide.h"

const char *tide_version(void) { return TIDE_VERSION; }

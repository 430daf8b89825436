/*
 * test_select.h - the cases of one cmocka program split between ctest
 * entries, so that `ctest -j` runs a long program's parts side by side:
 * `test_x NAME...` runs only the named cases, `test_x --skip NAME...` all but
 * those, `test_x` all of them. A name that is no case of the program is an
 * error, so an entry cannot silently run nothing.
 */
#ifndef TIDE_TEST_SELECT_H
#define TIDE_TEST_SELECT_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Keeps in t[0..n) the cases argv selects, in their order; returns how many,
 * 0 after printing the reason when argv names an unknown case. */
static size_t test_select(struct CMUnitTest *t, size_t n, int argc, char **argv) {
    bool skip = argc > 1 && !strcmp(argv[1], "--skip");
    int first = skip ? 2 : 1;
    if (argc <= first) return skip ? 0 : n;
    for (int a = first; a < argc; a++) {
        size_t i = 0;
        while (i < n && strcmp(t[i].name, argv[a])) i++;
        if (i == n) {
            fprintf(stderr, "%s: no case named %s\n", argv[0], argv[a]);
            return 0;
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        bool named = false;
        for (int a = first; a < argc && !named; a++) named = !strcmp(t[i].name, argv[a]);
        if (named != skip) t[kept++] = t[i];
    }
    return kept;
}

#endif

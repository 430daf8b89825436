/*
 * test_version.c - one version everywhere: the numbers of include/tide.h,
 * its TIDE_VERSION string and TIDE_VERSION_NUMBER, the library's
 * tide_version(), the CMake project's version (which CMakeLists.txt reads
 * from the header; given here as TIDE_PROJECT_VERSION) and what
 * `tide --version` prints ($TIDE_CLI).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void header_string_is_the_numbers(void **state) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", TIDE_VERSION_MAJOR, TIDE_VERSION_MINOR, TIDE_VERSION_PATCH);
    assert_string_equal(TIDE_VERSION, want);
    assert_int_equal(TIDE_VERSION_NUMBER,
                     TIDE_VERSION_MAJOR * 1000000 + TIDE_VERSION_MINOR * 1000 + TIDE_VERSION_PATCH);
}

static void library_is_the_header(void **state) { assert_string_equal(tide_version(), TIDE_VERSION); }

static void cmake_project_is_the_header(void **state) { assert_string_equal(TIDE_PROJECT_VERSION, TIDE_VERSION); }

static void cli_prints_the_version(void **state) {
    const char *cli = getenv("TIDE_CLI");
    if (!cli || !*cli) skip();
    char cmd[4096], line[256] = "";
    snprintf(cmd, sizeof cmd, "'%s' --version", cli);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(line, sizeof line, p));
    assert_int_equal(pclose(p), 0);
    char want[128];
    snprintf(want, sizeof want, "tide %s\n", TIDE_VERSION);
    assert_string_equal(line, want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(header_string_is_the_numbers),
        cmocka_unit_test(library_is_the_header),
        cmocka_unit_test(cmake_project_is_the_header),
        cmocka_unit_test(cli_prints_the_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

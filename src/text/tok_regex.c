/*
 * tok_regex.c - the pre-tokenizers' and normalizers' patterns through PCRE2:
 * regexes compiled with UTF and Unicode properties (\p{L}, \s as Unicode
 * white space), literal strings as PCRE2 literals, JIT-compiled where the
 * platform has it. Subjects are valid UTF-8 by construction (tok_encode.c), so
 * matching skips PCRE2's own check.
 */
#include "text/tok_int.h"

tide_status tok_regex_compile(tide_tokenizer *t, const char *what, const char *pattern, bool literal,
                              tok_regex *re) {
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    re->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
    if (!re->code) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof buf);
        return tide_err(t->ctx, TIDE_E_FORMAT, "%s: %s '%s': bad regex at offset %zu: %s", t->json_path, what,
                        pattern, (size_t)off, (const char *)buf);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return TIDE_OK;
}

void tok_regex_free(tok_regex *re) {
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

int tok_regex_find(tide_tokenizer *t, const tok_regex *re, const uint8_t *s, size_t n, size_t from, size_t *ms,
                   size_t *me) {
    int rc = re->jit ? pcre2_jit_match(re->code, s, n, from, PCRE2_NO_UTF_CHECK, t->md, NULL)
                     : pcre2_match(re->code, s, n, from, PCRE2_NO_UTF_CHECK, t->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return rc;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

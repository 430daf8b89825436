/*
 * chat.c - chat templates: a model's conversation format, recognised from the
 * markers in its Jinja chat template and written out in C (no Jinja engine).
 *
 * A family is one published prompt format; tide_chat_format() renders what
 * transformers' apply_chat_template(tokenize=False) renders with that family's
 * template, byte for byte (tests/test_chat.c against the recordings of
 * scripts/make_chat_fixtures.py, whose header states each family's variant).
 * BOS and EOS stand for the tokenizer's own pieces, as bos_token / eos_token
 * do in the templates (empty when the tokenizer names none). "strip" below is
 * Python's str.strip() (Jinja's trim): the code points str.isspace() accepts.
 *
 *   llama2   [system: "<<SYS>>\n" S "\n<</SYS>>\n\n" joined to the first
 *            user text]; user BOS "[INST] " strip(T) " [/INST]", assistant
 *            " " strip(T) " " EOS; user/assistant alternate; no generation
 *            prompt.
 *   llama3   BOS once, then "<|start_header_id|>" R "<|end_header_id|>\n\n"
 *            strip(T) "<|eot_id|>" for any role; prompt: the assistant header.
 *   chatml   "<|im_start|>" R "\n" T "<|im_end|>\n" for any role, T as given;
 *            prompt "<|im_start|>assistant\n".
 *   mistral  BOS once; [system: S "\n\n" before the first user text]; user
 *            "[INST] " T " [/INST]", assistant T EOS; alternate; no prompt.
 *   zephyr   "<|" R "|>\n" T EOS "\n" for system, user, assistant in any
 *            order; prompt "<|assistant|>\n".
 *   gemma    BOS; [system: S "\n\n" at the start of the first user turn];
 *            "<start_of_turn>" R "\n" strip(T) "<end_of_turn>\n" with the
 *            assistant's R written "model"; alternate; prompt
 *            "<start_of_turn>model\n".
 * A system message is taken only as the first message (llama2, mistral,
 * gemma); anything else those templates raise on is TIDE_E_INVALID naming the
 * message, with the template's own words.
 *
 * Detection looks for markers in the template's source, in this order:
 * "<|start_header_id|>" llama3; "<|im_start|>" chatml; "<start_of_turn>"
 * gemma; "[INST]" with "<<SYS>>" llama2, without it mistral; "<|user|>"
 * zephyr unless "<|end|>" (Phi-3) or "<|endoftext|>" (GLM-4) is there too.
 * Variants of a family (a default system prompt, dates, tools) are not told
 * apart: the caller may name a family instead (the CLI's --template).
 */
#include "core/core.h"

#include <string.h>

typedef enum chat_family {
    CHAT_LLAMA2,
    CHAT_LLAMA3,
    CHAT_CHATML,
    CHAT_MISTRAL,
    CHAT_ZEPHYR,
    CHAT_GEMMA,
    CHAT_N_FAMILIES
} chat_family;

static const char *const chat_family_names[CHAT_N_FAMILIES] = {"llama2", "llama3", "chatml",
                                                              "mistral", "zephyr", "gemma"};
#define CHAT_NAMES "llama2, llama3, chatml, mistral, zephyr, gemma"

struct tide_chat_template {
    chat_family family;
    const char *bos; /* the tokenizer's BOS piece, "" when it has none */
    const char *eos; /* likewise EOS */
};

const char *tide_chat_template_names(void) { return CHAT_NAMES; }

static bool has(const char *src, const char *marker) { return strstr(src, marker) != NULL; }

/* The family whose markers src holds, or -1. */
static int chat_detect(const char *src) {
    if (has(src, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (has(src, "<|im_start|>")) return CHAT_CHATML;
    if (has(src, "<start_of_turn>")) return CHAT_GEMMA;
    if (has(src, "[INST]")) return has(src, "<<SYS>>") ? CHAT_LLAMA2 : CHAT_MISTRAL;
    if (has(src, "<|user|>") && !has(src, "<|end|>") && !has(src, "<|endoftext|>")) return CHAT_ZEPHYR;
    return -1;
}

/* Returns TIDE_OK; TIDE_E_INVALID (no tokenizer or no out), TIDE_E_NOT_FOUND
 * (unknown name; no name and no template), TIDE_E_UNSUPPORTED (a template of
 * no known family), TIDE_E_NOMEM. *out is NULL on failure. */
tide_status tide_chat_template_get(tide_ctx *ctx, const tide_tokenizer *t, const char *name,
                                   tide_chat_template **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "tide_chat_template_get: no output pointer");
    *out = NULL;
    if (!t) return tide_err(ctx, TIDE_E_INVALID, "tide_chat_template_get: no tokenizer");
    int fam = -1;
    if (name) {
        for (int i = 0; i < CHAT_N_FAMILIES; i++)
            if (!strcmp(name, chat_family_names[i])) fam = i;
        if (fam < 0)
            return tide_err(ctx, TIDE_E_NOT_FOUND, "unknown chat template '%s' (known: %s)", name, CHAT_NAMES);
    } else {
        const char *src = tide_tokenizer_chat_template(t);
        if (!src)
            return tide_err(ctx, TIDE_E_NOT_FOUND,
                            "the model has no chat template; name its format with --template NAME (%s)", CHAT_NAMES);
        if ((fam = chat_detect(src)) < 0)
            return tide_err(ctx, TIDE_E_UNSUPPORTED,
                            "the model's chat template is of no known family; name its format with --template NAME "
                            "(%s)", CHAT_NAMES);
    }
    tide_chat_template *c = tide_malloc(sizeof *c);
    if (!c) return tide_err(ctx, TIDE_E_NOMEM, "out of memory for a chat template");
    int32_t bos = tide_tokenizer_bos(t), eos = tide_tokenizer_eos(t);
    const char *bp = bos >= 0 ? tide_tokenizer_piece(t, bos) : NULL;
    const char *ep = eos >= 0 ? tide_tokenizer_piece(t, eos) : NULL;
    c->family = (chat_family)fam;
    c->bos = bp ? bp : "";
    c->eos = ep ? ep : "";
    *out = c;
    return TIDE_OK;
}

void tide_chat_template_free(tide_chat_template *c) { tide_free(c); }

const char *tide_chat_template_name(const tide_chat_template *c) { return chat_family_names[c->family]; }

const char *tide_chat_template_end_of_turn(const tide_chat_template *c) {
    switch (c->family) {
    case CHAT_LLAMA3: return "<|eot_id|>";
    case CHAT_CHATML: return "<|im_end|>";
    case CHAT_GEMMA: return "<end_of_turn>";
    default: return c->eos[0] ? c->eos : "</s>"; /* llama2, mistral, zephyr end a turn with EOS */
    }
}

void tide_free_text(char *text) { tide_free(text); }

/* ------------------------------------------------------------ output */

/* The text being written: a tide_strbuf (p[0..len) with a NUL after it; oom
 * once a growth has failed: later appends do nothing, the caller reports it
 * once). */
typedef tide_strbuf chat_buf;

static void buf_puts(chat_buf *b, const char *s) { tide_strbuf_add(b, s, strlen(s)); }

/* Python's str.isspace() for one code point. */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The code point at s[i..n) and its length in bytes; a byte that does not
 * start a whole, shortest-form sequence is one U+FFFD (never a space), as
 * Python's errors="replace" reads it. */
static uint32_t cp_at(const unsigned char *s, size_t i, size_t n, size_t *len) {
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    unsigned c = s[i];
    size_t l = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    *len = 1;
    if (l == 1) return c;
    if (l == 0 || i + l > n) return 0xFFFD;
    uint32_t v = c & (0x7Fu >> l);
    for (size_t k = 1; k < l; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return 0xFFFD;
        v = v << 6 | (s[i + k] & 0x3F);
    }
    if (v < least[l]) return 0xFFFD;
    *len = l;
    return v;
}

/* Strips b->p[from..len) in place, as str.strip() would that part alone. */
static void buf_strip_from(chat_buf *b, size_t from) {
    if (b->oom) return;
    const unsigned char *s = (const unsigned char *)b->p;
    size_t i = from, l;
    while (i < b->len && py_space(cp_at(s, i, b->len, &l))) i += l;
    size_t end = b->len;
    while (end > i) {
        size_t st = end - 1;
        while (st > i && (s[st] & 0xC0) == 0x80 && end - st < 4) st--;
        uint32_t c = cp_at(s, st, end, &l);
        if (st + l != end) { /* not a whole sequence ending here: its last byte alone */
            st = end - 1;
            c = s[st] < 0x80 ? s[st] : 0xFFFD;
        }
        if (!py_space(c)) break;
        end = st;
    }
    memmove(b->p + from, b->p + i, end - i);
    b->len = from + (end - i);
    b->p[b->len] = 0;
}

static void buf_put_stripped(chat_buf *b, const char *s) {
    size_t from = b->len;
    buf_puts(b, s);
    buf_strip_from(b, from);
}

/* ------------------------------------------------------------ formatting */

static const char *const ALTERNATE = "roles must alternate user/assistant after the optional system message";

static bool is(const char *role, const char *want) { return !strcmp(role, want); }

/* The families that take a system message only first and then alternate
 * user/assistant (llama2, mistral, gemma): checks turn k (from 0 after the
 * system message) of message i, with the template's message. */
static tide_status check_turn(tide_ctx *ctx, const tide_chat_template *c, const tide_chat_msg *m, int i, int k) {
    bool user = is(m->role, "user"), known = user || is(m->role, "assistant");
    if (!known && c->family != CHAT_GEMMA)
        return tide_err(ctx, TIDE_E_INVALID, "chat template %s: message %d: a %s message is allowed only first",
                        chat_family_names[c->family], i, m->role);
    if (!known || user != (k % 2 == 0))
        return tide_err(ctx, TIDE_E_INVALID, "chat template %s: message %d (%s): %s", chat_family_names[c->family],
                        i, m->role, ALTERNATE);
    return TIDE_OK;
}

static tide_status format_alternating(tide_ctx *ctx, const tide_chat_template *c, const tide_chat_msg *msgs, int n,
                                      bool gen, chat_buf *b) {
    const char *sys = NULL;
    int start = 0;
    if (n > 0 && is(msgs[0].role, "system")) {
        sys = msgs[0].content;
        start = 1;
    }
    if (c->family != CHAT_LLAMA2) buf_puts(b, c->bos);
    for (int i = start; i < n; i++) {
        const tide_chat_msg *m = &msgs[i];
        int k = i - start;
        tide_status st = check_turn(ctx, c, m, i, k);
        if (st) return st;
        bool user = is(m->role, "user");
        switch (c->family) {
        case CHAT_LLAMA2: {
            if (user) {
                buf_puts(b, c->bos);
                buf_puts(b, "[INST] ");
            } else {
                buf_puts(b, " ");
            }
            /* the system block joins the text before it is stripped */
            size_t from = b->len;
            if (k == 0 && sys) {
                buf_puts(b, "<<SYS>>\n");
                buf_puts(b, sys);
                buf_puts(b, "\n<</SYS>>\n\n");
            }
            buf_puts(b, m->content);
            buf_strip_from(b, from);
            if (user) {
                buf_puts(b, " [/INST]");
            } else {
                buf_puts(b, " ");
                buf_puts(b, c->eos);
            }
            break;
        }
        case CHAT_MISTRAL:
            if (user) {
                buf_puts(b, "[INST] ");
                if (k == 0 && sys) {
                    buf_puts(b, sys);
                    buf_puts(b, "\n\n");
                }
                buf_puts(b, m->content);
                buf_puts(b, " [/INST]");
            } else {
                buf_puts(b, m->content);
                buf_puts(b, c->eos);
            }
            break;
        default: /* gemma */
            buf_puts(b, "<start_of_turn>");
            buf_puts(b, user ? "user" : "model");
            buf_puts(b, "\n");
            if (k == 0 && sys) {
                buf_puts(b, sys);
                buf_puts(b, "\n\n");
            }
            buf_put_stripped(b, m->content);
            buf_puts(b, "<end_of_turn>\n");
            break;
        }
    }
    if (gen && c->family == CHAT_GEMMA) buf_puts(b, "<start_of_turn>model\n");
    return TIDE_OK;
}

/* Returns TIDE_OK, TIDE_E_INVALID (bad arguments, no messages, or a role or
 * order the family refuses: the message names the message's index and role) or
 * TIDE_E_NOMEM; *out is NULL on failure. */
tide_status tide_chat_format(tide_ctx *ctx, const tide_chat_template *c, const tide_chat_msg *msgs, int n,
                             bool add_generation_prompt, char **out, size_t *len) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "tide_chat_format: no output pointer");
    *out = NULL;
    if (len) *len = 0;
    if (!c || n < 0 || (n > 0 && !msgs))
        return tide_err(ctx, TIDE_E_INVALID, "tide_chat_format: no template or no messages");
    if (n == 0) /* as apply_chat_template refuses one */
        return tide_err(ctx, TIDE_E_INVALID, "tide_chat_format: an empty conversation (no messages)");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0])
            return tide_err(ctx, TIDE_E_INVALID, "chat message %d has no %s", i,
                            msgs[i].content ? "role" : "content");

    chat_buf b = {0};
    tide_strbuf_add(&b, "", 0); /* a text even when the conversation renders as nothing (llama2's lone system message) */
    tide_status st = TIDE_OK;
    switch (c->family) {
    case CHAT_LLAMA3:
        for (int i = 0; i < n; i++) {
            if (i == 0) buf_puts(&b, c->bos);
            buf_puts(&b, "<|start_header_id|>");
            buf_puts(&b, msgs[i].role);
            buf_puts(&b, "<|end_header_id|>\n\n");
            buf_put_stripped(&b, msgs[i].content);
            buf_puts(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) buf_puts(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            buf_puts(&b, "<|im_start|>");
            buf_puts(&b, msgs[i].role);
            buf_puts(&b, "\n");
            buf_puts(&b, msgs[i].content);
            buf_puts(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) buf_puts(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_ZEPHYR:
        for (int i = 0; i < n && !st; i++) {
            const char *r = msgs[i].role;
            if (!is(r, "system") && !is(r, "user") && !is(r, "assistant")) {
                st = tide_err(ctx, TIDE_E_INVALID, "chat template zephyr: message %d: unknown role %s", i, r);
                break;
            }
            buf_puts(&b, "<|");
            buf_puts(&b, r);
            buf_puts(&b, "|>\n");
            buf_puts(&b, msgs[i].content);
            buf_puts(&b, c->eos);
            buf_puts(&b, "\n");
        }
        if (add_generation_prompt) buf_puts(&b, "<|assistant|>\n");
        break;
    default:
        st = format_alternating(ctx, c, msgs, n, add_generation_prompt, &b);
        break;
    }
    if (!st && b.oom) st = tide_err(ctx, TIDE_E_NOMEM, "out of memory formatting a conversation");
    if (st) {
        tide_free(b.p);
        return st;
    }
    *out = b.p;
    if (len) *len = b.len;
    return TIDE_OK;
}
